package chart_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

// TestValuesSchema: every values file the chart ships meets
// values.schema.json on its own and over the defaults, and the schema
// refuses an unknown or misspelt key and a value of the wrong type, naming
// it, before any template runs.
func TestValuesSchema(t *testing.T) {
	ch, err := loader.Load(chartDir)
	require.NoError(t, err)
	require.NotEmpty(t, ch.Schema, "the chart has a values.schema.json")
	files, err := filepath.Glob(filepath.Join(chartDir, "values*.yaml"))
	require.NoError(t, err)
	require.Len(t, files, 7, "values.yaml and the six values-*.yaml")
	for _, f := range files {
		vals, err := chartutil.ReadValuesFile(f)
		require.NoError(t, err, f)
		assert.NoError(t, chartutil.ValidateAgainstSingleSchema(vals, ch.Schema), "%s alone", f)
		all, err := chartutil.CoalesceValues(ch, vals)
		require.NoError(t, err, f)
		assert.NoError(t, chartutil.ValidateAgainstSchema(ch, all), "%s over the defaults", f)
	}

	for _, tc := range []struct {
		name string
		sets []string
		want string
	}{
		{"a misspelt top-level key", []string{"sugre=false"}, "additional properties 'sugre' not allowed"},
		{"an upstream peer-pods value", []string{"provider=aws"}, "additional properties 'provider' not allowed"},
		{"a misspelt nested key", []string{"image.pullpolicy=Always"}, "additional properties 'pullpolicy' not allowed"},
		{"imagePullSecret for imagePullSecrets", []string{"imagePullSecret[0].name=regcred"}, "additional properties 'imagePullSecret' not allowed"},
		{"a word for a number", []string{"clusterScope.enabled=true", "clusterScope.replicas=two"}, "at '/clusterScope/replicas': got string, want integer"},
		{"a string for a boolean", []string{"hypervisor.enabled=yes"}, "at '/hypervisor/enabled': got string, want boolean"},
		{"no replica", []string{"clusterScope.replicas=0"}, "at '/clusterScope/replicas'"},
		{"a number as a node label", []string{"nodeSelector.pool=1"}, "at '/nodeSelector/pool': got number, want string"},
		{"a tag as the digest", []string{"image.digest=v1.2.3"}, "at '/image/digest'"},
		{"an unknown pull policy", []string{"image.pullPolicy=Sometimes"}, "at '/image/pullPolicy'"},
		{"a lower-case setting", []string{"settings.caa_resync=2m"}, "'caa_resync' does not match pattern"},
		{"a pull secret without a name", []string{"imagePullSecrets[0].secret=regcred"}, "at '/imagePullSecrets/0'"},
		{"an env var without a name", []string{"extraEnv[0].value=x"}, "at '/extraEnv/0'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderChart([]string{valuesFile("aws")}, tc.sets...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "values don't meet the specifications of the schema")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
