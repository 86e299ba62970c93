package adaptorcfg

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// commonKeys are the keys upstream's adaptor reads on every cloud
// (cmd/cloud-api-adaptor/main.go at fbdde756), with CLOUD_PROVIDER
// (pkg/adaptor/k8sops/peerpod.go), DISABLECVM and TAGS (each provider).
var commonKeys = []string{"CLOUD_PROVIDER", "DISABLECVM", "TAGS", "REMOTE_HYPERVISOR_ENDPOINT", "PODS_DIR", "PAUSE_IMAGE",
	"FORWARDER_PORT", "CACERT_FILE", "CERT_FILE", "CERT_KEY", "TLS_SKIP_VERIFY", "TLS_MIN_VERSION", "TLS_CIPHER_SUITES",
	"PROXY_TIMEOUT", "TUNNEL_TYPE", "VXLAN_PORT", "INITDATA", "CLOUD_CONFIG_VERIFY", "PEERPODS_LIMIT_PER_NODE",
	"ENABLE_SCRATCH_SPACE", "EXTERNAL_NETWORK_VIA_PODVM", "POD_SUBNET_CIDRS"}

// cloudKeys are each provider's own keys with an environment variable
// (src/cloud-providers/<cloud>/manager.go), the Secret's included.
var cloudKeys = map[string][]string{
	"aws": {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "PODVM_INSTANCE_TYPE", "AWS_REGION",
		"PODVM_LAUNCHTEMPLATE_NAME", "USE_PODVM_LAUNCHTEMPLATE", "PODVM_AMI_ID", "SSH_KP_NAME", "AWS_SUBNET_ID",
		"USE_PUBLIC_IP", "ROOT_VOLUME_SIZE", "AWS_SG_IDS", "PODVM_INSTANCE_TYPES"},
	"azure": {"AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID", "AZURE_SUBSCRIPTION_ID", "AZURE_REGION",
		"AZURE_RESOURCE_GROUP", "AZURE_INSTANCE_SIZE", "AZURE_SUBNET_ID", "AZURE_NSG_ID", "AZURE_IMAGE_ID", "SSH_USERNAME",
		"ENABLE_SECURE_BOOT", "USE_PUBLIC_IP", "ROOT_VOLUME_SIZE", "AZURE_INSTANCE_SIZES"},
	"ibmcloud": {"IBMCLOUD_API_KEY", "IBMCLOUD_IAM_PROFILE_ID", "IBMCLOUD_IAM_ENDPOINT", "IBMCLOUD_VPC_ENDPOINT",
		"IBMCLOUD_RESOURCE_GROUP_ID", "IBMCLOUD_PODVM_INSTANCE_PROFILE_NAME", "IBMCLOUD_ZONE", "IBMCLOUD_VPC_SUBNET_ID",
		"IBMCLOUD_SSH_KEY_ID", "IBMCLOUD_VPC_ID", "IBMCLOUD_CLUSTER_ID", "IBMCLOUD_PODVM_INSTANCE_PROFILE_LIST",
		"IBMCLOUD_PODVM_IMAGE_ID", "IBMCLOUD_SECURITY_GROUP_IDS", "IBMCLOUD_DEDICATED_HOST_IDS", "IBMCLOUD_DEDICATED_HOST_GROUP_IDS"},
}

// TestEveryUpstreamKeyHasARule: each cloud's rules are exactly upstream's
// keys, so none is unknown to caa and caa invents none.
func TestEveryUpstreamKeyHasARule(t *testing.T) {
	for cloud, own := range cloudKeys {
		want := append(append([]string{}, commonKeys...), own...)
		sort.Strings(want)
		var got []string
		for k := range common(cloud) {
			got = append(got, k)
		}
		sort.Strings(got)
		assert.Equal(t, want, got, cloud)
	}
}

func entries(kv map[string]string) map[string]Entry {
	out := map[string]Entry{}
	for k, v := range kv {
		out[k] = Entry{Value: v, Path: "/etc/peer-pods/" + k, Dir: "/etc/peer-pods"}
	}
	return out
}

// flags is a Result's settings as target=value, sorted.
func flags(r Result) []string {
	var out []string
	for _, s := range r.Settings {
		target := "--" + s.Flag
		if s.Env != "" {
			target = "$" + s.Env
		}
		d := ""
		if s.Default {
			d = " (default)"
		}
		out = append(out, target+"="+s.Value+d)
	}
	sort.Strings(out)
	return out
}

func TestMap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		keys     map[string]string
		want     []string
		accepted []string
	}{{
		name: "aws, as upstream's chart writes it",
		keys: map[string]string{"CLOUD_PROVIDER": "aws", "AWS_REGION": "eu-west-1", "AWS_SUBNET_ID": "subnet-1",
			"AWS_SG_IDS": "sg-1, sg-2", "PODVM_AMI_ID": "ami-1", "PODVM_INSTANCE_TYPES": "m6a.large,m6a.xlarge",
			"DISABLECVM": "false", "TAGS": "team=a,env=prod", "VXLAN_PORT": "4789", "TUNNEL_TYPE": "vxlan",
			"FORWARDER_PORT": "", "PODVM_LAUNCHTEMPLATE_NAME": "kata", "ROOT_VOLUME_SIZE": "30", "PROXY_TIMEOUT": "5m",
			"REMOTE_HYPERVISOR_ENDPOINT": "/run/peerpod/hypervisor.sock", "PODS_DIR": "/run/peerpod/pods", "INITDATA": "H4sIAAAA",
			"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s3cret"},
		want: []string{"$AWS_ACCESS_KEY_ID=AKIA", "$AWS_SECRET_ACCESS_KEY=s3cret", "--agent-socket-dir=/run/peerpod/pods",
			"--aws-image=ami-1", "--aws-instance-type=m6a.large (default)", "--aws-region=eu-west-1",
			"--aws-security-group-ids=sg-1,sg-2", "--aws-subnet-id=subnet-1", "--aws-tags=team=a,env=prod", "--confidential=true",
			"--hypervisor-socket=/run/peerpod/hypervisor.sock", "--initdata-file=/etc/peer-pods/INITDATA",
			"--instance-types=m6a.large,m6a.xlarge", "--max-pod-vms=10 (default)", "--provider=aws", "--start-vm-timeout=5m"},
		accepted: []string{"FORWARDER_PORT", "PODVM_LAUNCHTEMPLATE_NAME", "ROOT_VOLUME_SIZE", "TUNNEL_TYPE", "VXLAN_PORT"},
	}, {
		name: "azure",
		keys: map[string]string{"CLOUD_PROVIDER": "azure", "AZURE_SUBSCRIPTION_ID": "sub", "AZURE_REGION": "eastus",
			"AZURE_RESOURCE_GROUP": "rg", "AZURE_SUBNET_ID": "/subscriptions/sub/x", "AZURE_IMAGE_ID": "/img",
			"AZURE_INSTANCE_SIZE": "Standard_DC4as_v5", "AZURE_NSG_ID": "/nsg", "DISABLECVM": "true", "PEERPODS_LIMIT_PER_NODE": "20",
			"AZURE_CLIENT_ID": "id", "AZURE_TENANT_ID": "tenant", "AZURE_CLIENT_SECRET": "pw", "ENABLE_SECURE_BOOT": "false"},
		want: []string{"$AZURE_CLIENT_ID=id", "$AZURE_CLIENT_SECRET=pw", "$AZURE_TENANT_ID=tenant", "--azure-admin-username=peerpod (default)",
			"--azure-image=/img", "--azure-instance-type=Standard_DC4as_v5", "--azure-location=eastus", "--azure-resource-group=rg",
			"--azure-secure-boot=false", "--azure-security-group-id=/nsg", "--azure-subnet-id=/subscriptions/sub/x", "--azure-subscription-id=sub",
			"--confidential=false", "--hypervisor-socket=/run/peerpod/hypervisor.sock (default)", "--max-pod-vms=20", "--provider=azure"},
	}, {
		name: "azure: secure boot asked for is secure boot",
		keys: map[string]string{"CLOUD_PROVIDER": "azure", "ENABLE_SECURE_BOOT": "True"},
		want: []string{"--azure-admin-username=peerpod (default)", "--azure-instance-type=Standard_DC2as_v5 (default)",
			"--azure-secure-boot=true", "--hypervisor-socket=/run/peerpod/hypervisor.sock (default)", "--max-pod-vms=10 (default)",
			"--provider=azure"},
	}, {
		name: "ibmcloud: the region from the zone, IAM's service URL, the API key as a file, not confidential by default",
		keys: map[string]string{"CLOUD_PROVIDER": "ibmcloud", "IBMCLOUD_ZONE": "us-south-2", "IBMCLOUD_VPC_SUBNET_ID": "sn",
			"IBMCLOUD_VPC_ID": "vpc", "IBMCLOUD_PODVM_IMAGE_ID": "r006-img", "IBMCLOUD_PODVM_INSTANCE_PROFILE_NAME": "bx2-2x8",
			"IBMCLOUD_IAM_ENDPOINT": "https://iam.cloud.ibm.com/identity/token", "IBMCLOUD_SECURITY_GROUP_IDS": "sg1,sg2",
			"IBMCLOUD_VPC_ENDPOINT": "https://us-south.iaas.cloud.ibm.com/v1", "IBMCLOUD_API_KEY": "key", "IBMCLOUD_CLUSTER_ID": "c1a2b3",
			"TAGS": "env:prod, team,owner:a:b"},
		want: []string{"--confidential=false (default)", "--hypervisor-socket=/run/peerpod/hypervisor.sock (default)",
			"--ibmcloud-api-key-file=/etc/peer-pods/IBMCLOUD_API_KEY", "--ibmcloud-cluster-id=c1a2b3",
			"--ibmcloud-endpoint=https://us-south.iaas.cloud.ibm.com/v1", "--ibmcloud-iam-endpoint=https://iam.cloud.ibm.com",
			"--ibmcloud-image=r006-img", "--ibmcloud-instance-type=bx2-2x8", "--ibmcloud-region=us-south",
			"--ibmcloud-security-group-ids=sg1,sg2", "--ibmcloud-subnet-id=sn", "--ibmcloud-tags=env=prod,team=,owner=a:b",
			"--ibmcloud-vpc-id=vpc", "--ibmcloud-zone=us-south-2", "--max-pod-vms=10 (default)", "--provider=ibmcloud"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := Map(entries(tc.keys))
			require.NoError(t, r.Err())
			assert.Equal(t, tc.want, flags(r))
			var accepted []string
			for _, n := range r.Accepted {
				accepted = append(accepted, n.Key)
			}
			sort.Strings(accepted)
			assert.Equal(t, tc.accepted, accepted)
			// Every key given is accounted for: mapped or accepted.
			for k := range tc.keys {
				found := false
				for _, s := range r.Settings {
					found = found || s.Key == k
				}
				for _, n := range r.Accepted {
					found = found || n.Key == k
				}
				assert.True(t, found, "%s is neither mapped nor accepted", k)
			}
		})
	}
}

// TestMapRefuses: an unknown key, another cloud's, a value caa cannot honour
// or cannot parse is refused by name, and a secret's value is never shown.
func TestMapRefuses(t *testing.T) {
	base := map[string]string{"CLOUD_PROVIDER": "aws", "AWS_REGION": "eu-west-1"}
	for _, tc := range []struct {
		key, value string
		want       string
	}{
		{"AWS_REGOIN", "eu-west-1", `AWS_REGOIN="eu-west-1": unknown: not a key of upstream's cloud-api-adaptor`},
		{"AZURE_REGION", "eastus", `AZURE_REGION="eastus": a key of azure, but CLOUD_PROVIDER is aws`},
		{"VXLAN_PORT", "4790", `VXLAN_PORT="4790": unsupported: caa's VXLAN tunnels use UDP port 4789 (remove the key or set it to 4789)`},
		{"TUNNEL_TYPE", "peerpod", `TUNNEL_TYPE="peerpod": unsupported: caa makes VXLAN tunnels only`},
		{"USE_PUBLIC_IP", "true", `USE_PUBLIC_IP="true": unsupported`},
		{"TLS_MIN_VERSION", "VersionTLS13", `TLS_MIN_VERSION="VersionTLS13": unsupported`},
		{"CACERT_FILE", "/etc/certificates/ca.crt", `CACERT_FILE="/etc/certificates/ca.crt": unsupported: caa issues the agent certificates from its own CA`},
		{"USE_PODVM_LAUNCHTEMPLATE", "true", `USE_PODVM_LAUNCHTEMPLATE="true": unsupported`},
		{"DISABLECVM", "maybe", `DISABLECVM="maybe": "maybe" is not a boolean`},
		{"PEERPODS_LIMIT_PER_NODE", "ten", `PEERPODS_LIMIT_PER_NODE="ten": "ten" is not a whole number`},
		{"PROXY_TIMEOUT", "5", `PROXY_TIMEOUT="5": "5" is not a duration`},
		{"TAGS", "team", `TAGS="team": tag "team" is not key=value`},
		{"AZURE_CLIENT_SECRET", "hunter2", `AZURE_CLIENT_SECRET="(secret)": a key of azure`},
		{"IBMCLOUD_API_KEY", "hunter2", `IBMCLOUD_API_KEY="(secret)": a key of ibmcloud`},
	} {
		t.Run(tc.key, func(t *testing.T) {
			keys := map[string]string{tc.key: tc.value}
			for k, v := range base {
				keys[k] = v
			}
			r := Map(entries(keys))
			err := r.Err()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "hunter2")
			require.Len(t, r.Problems, 1, "only %s is refused", tc.key)
		})
	}
	for _, tc := range []struct {
		keys map[string]string
		want string
	}{
		{map[string]string{"AWS_REGION": "x"}, "CLOUD_PROVIDER: missing"},
		{map[string]string{"CLOUD_PROVIDER": "libvirt"}, `CLOUD_PROVIDER="libvirt": caa runs on aws, azure or ibmcloud`},
		{map[string]string{"CLOUD_PROVIDER": "ibmcloud", "IBMCLOUD_PODVM_IMAGE_ID": "a,b"}, "names several images"},
		{map[string]string{"CLOUD_PROVIDER": "ibmcloud", "IBMCLOUD_IAM_ENDPOINT": "http://iam"}, "is not an https URL"},
		{map[string]string{"CLOUD_PROVIDER": "ibmcloud", "TAGS": "env=prod"}, `tag "env=prod" holds '=': IBM Cloud's tags are key:value`},
		{map[string]string{"CLOUD_PROVIDER": "ibmcloud", "TAGS": ":prod"}, `tag ":prod" has no key`},
		{map[string]string{"CLOUD_PROVIDER": "ibmcloud", "ROOT_VOLUME_SIZE": "30"}, "a key of"},
		{map[string]string{"CLOUD_PROVIDER": "ibmcloud", "IBMCLOUD_IAM_PROFILE_ID": "Profile-1"}, `IBMCLOUD_IAM_PROFILE_ID="(secret)": unsupported`},
	} {
		err := Map(entries(tc.keys)).Err()
		require.Error(t, err, "%v", tc.keys)
		assert.Contains(t, err.Error(), tc.want)
	}
	// Several problems are all named in one error.
	err := Map(entries(map[string]string{"CLOUD_PROVIDER": "aws", "FOO": "1", "BAR": "2"})).Err()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "BAR=")
	assert.Contains(t, err.Error(), "FOO=")
}

// TestReadDirs reads a ConfigMap volume as the kubelet lays it out: each
// key a link into a timestamped directory through ..data.
func TestReadDirs(t *testing.T) {
	cm := t.TempDir()
	ts := filepath.Join(cm, "..2026_12_02_08_00_00.123")
	require.NoError(t, os.Mkdir(ts, 0o755))
	for k, v := range map[string]string{"CLOUD_PROVIDER": "aws\n", "AWS_REGION": "eu-west-1"} {
		require.NoError(t, os.WriteFile(filepath.Join(ts, k), []byte(v), 0o644))
		require.NoError(t, os.Symlink(filepath.Join("..data", k), filepath.Join(cm, k)))
	}
	require.NoError(t, os.Symlink(filepath.Base(ts), filepath.Join(cm, "..data")))
	secret := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(secret, "AWS_ACCESS_KEY_ID"), []byte("AKIA"), 0o600))

	keys, err := ReadDirs(cm, secret)
	require.NoError(t, err)
	assert.Equal(t, map[string]Entry{
		"CLOUD_PROVIDER":    {Value: "aws", Path: filepath.Join(cm, "CLOUD_PROVIDER"), Dir: cm},
		"AWS_REGION":        {Value: "eu-west-1", Path: filepath.Join(cm, "AWS_REGION"), Dir: cm},
		"AWS_ACCESS_KEY_ID": {Value: "AKIA", Path: filepath.Join(secret, "AWS_ACCESS_KEY_ID"), Dir: secret},
	}, keys)

	_, err = ReadDirs(cm, cm)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is in both")
	require.NoError(t, os.Mkdir(filepath.Join(secret, "sub"), 0o755))
	_, err = ReadDirs(secret)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is a directory, not a key")
	_, err = ReadDirs(filepath.Join(secret, "missing"))
	require.Error(t, err)
}

// TestApply: the mapping sets caa's flags and the SDK's variables, except
// where caa's own setting was given (flag or environment), which wins.
func TestApply(t *testing.T) {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	region := fs.String("aws-region", "", "EC2 region (env CAA_AWS_REGION, then AWS_REGION)")
	// caa's flags take their defaults from their variables, as here.
	subnet := fs.String("aws-subnet-id", "subnet-env", "subnet of every VM (env CAA_AWS_SUBNET_ID)")
	image := fs.String("aws-image", "", "AMI (env CAA_AWS_IMAGE)")
	sgs := fs.StringSlice("aws-security-group-ids", nil, "security groups (env CAA_AWS_SECURITY_GROUP_IDS)")
	tags := fs.StringToString("aws-tags", nil, "tags (env CAA_AWS_TAGS)")
	provider := fs.String("provider", "", "cloud (env CAA_PROVIDER)")
	require.NoError(t, fs.Parse([]string{"--aws-image=ami-explicit"}))
	env := map[string]string{"CAA_AWS_SUBNET_ID": "subnet-env", "AWS_SECRET_ACCESS_KEY": "already"}
	getenv := func(k string) string { return env[k] }
	setenv := func(k, v string) error { env[k] = v; return nil }

	r := Map(entries(map[string]string{"CLOUD_PROVIDER": "aws", "AWS_REGION": "eu-west-1", "AWS_SUBNET_ID": "subnet-cm",
		"PODVM_AMI_ID": "ami-cm", "AWS_SG_IDS": "sg-1,sg-2", "TAGS": "a=1,b=2",
		"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "from-secret"}))
	require.NoError(t, r.Err())
	// PODVM_INSTANCE_TYPE's default and DISABLECVM need flags this set
	// has not got: refused by name.
	_, err := Apply(fs, r, getenv, setenv)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PODVM_INSTANCE_TYPE maps to --aws-instance-type, which this caa has not got")

	fs.String("aws-instance-type", "", "type (env CAA_AWS_INSTANCE_TYPE)")
	fs.Int("max-pod-vms", 10, "capacity (env CAA_MAX_POD_VMS)")
	fs.String("hypervisor-socket", "", "kata's socket (env CAA_HYPERVISOR_SOCKET)")
	applied, err := Apply(fs, r, getenv, setenv)
	require.NoError(t, err)
	assert.Equal(t, "eu-west-1", *region, "mapped")
	assert.Equal(t, "subnet-env", *subnet, "CAA_AWS_SUBNET_ID wins")
	assert.Equal(t, "ami-explicit", *image, "--aws-image wins")
	assert.Equal(t, []string{"sg-1", "sg-2"}, *sgs)
	assert.Equal(t, map[string]string{"a": "1", "b": "2"}, *tags)
	assert.Equal(t, "aws", *provider)
	assert.Equal(t, "AKIA", env["AWS_ACCESS_KEY_ID"])
	assert.Equal(t, "already", env["AWS_SECRET_ACCESS_KEY"], "a credential already in the environment wins")
	var lines []string
	for _, a := range applied {
		lines = append(lines, a.String())
	}
	text := strings.Join(lines, "\n")
	assert.Contains(t, text, "--aws-region=eu-west-1 (from AWS_REGION)")
	assert.Contains(t, text, "--aws-image kept, given as --aws-image (PODVM_AMI_ID=ami-cm not applied)")
	assert.Contains(t, text, "--aws-subnet-id kept, given as $CAA_AWS_SUBNET_ID")
	assert.Contains(t, text, "$AWS_ACCESS_KEY_ID=(secret) (from AWS_ACCESS_KEY_ID)")
	assert.NotContains(t, text, "AKIA")
	assert.NotContains(t, text, "from-secret")

	// A refused configuration applies nothing.
	_, err = Apply(fs, Map(entries(map[string]string{"CLOUD_PROVIDER": "aws", "NOPE": "1"})), getenv, setenv)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NOPE")
}

// TestREADMETableNamesEveryKey: the README's table of keys (Coming from
// cloud-api-adaptor) lists every key caa has a rule for.
func TestREADMETableNamesEveryKey(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	text := string(raw)
	start := strings.Index(text, "## Coming from cloud-api-adaptor")
	require.GreaterOrEqual(t, start, 0, "the README has the section")
	section := text[start:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	for _, cloud := range Clouds {
		for k := range common(cloud) {
			assert.Contains(t, section, "`"+k+"`", "the README's table names %s", k)
		}
	}
}
