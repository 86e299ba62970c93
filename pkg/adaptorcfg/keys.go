package adaptorcfg

import (
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Clouds are the values of CLOUD_PROVIDER caa runs on.
var Clouds = []string{"aws", "azure", "ibmcloud"}

// rule says what caa does with one of upstream's keys.
type rule struct {
	// flag is caa's flag the value goes to (without "--"); env instead
	// names an environment variable a cloud SDK reads (credentials).
	flag, env string
	// file: the flag gets the key's file path, not its value (a secret or
	// a document caa reads itself).
	file bool
	// conv turns upstream's value into caa's; nil keeps it.
	conv func(string) (string, error)
	// same lists the values that ask for what caa does anyway (its fixed
	// behaviour): nothing to set. A key with neither flag nor env accepts
	// only these (and empty), and any other value is unsupported: why says
	// what caa does instead and what to change.
	same []string
	why  string
	// def is upstream's default when the key is absent or empty, applied
	// where caa's own default differs, so the ConfigMap means what it
	// meant to the adaptor.
	def string
}

// Upstream's keys, confirmed in confidential-containers/cloud-api-adaptor
// at fbdde756: src/cloud-api-adaptor/cmd/cloud-api-adaptor/main.go (the
// common keys), src/cloud-providers/{aws,azure,ibmcloud}/manager.go (each
// cloud's, with their defaults), pkg/adaptor/k8sops/peerpod.go
// (CLOUD_PROVIDER), and install/charts/peerpods (the ConfigMap
// peer-pods-cm and the Secret peer-pods-secret, both envFrom).
func common(cloud string) map[string]rule {
	tagsFlag := map[string]string{"aws": "aws-tags", "azure": "azure-tags", "ibmcloud": "ibmcloud-tags"}[cloud]
	rootDefault := map[string]string{"aws": "30", "azure": "0"}[cloud]
	rules := map[string]rule{
		"CLOUD_PROVIDER": {flag: "provider"},
		// caa asks for a confidential VM unless --confidential=false.
		"DISABLECVM": {flag: "confidential", conv: not},
		// The adaptor is always kata's remote hypervisor, on this socket
		// by default: so is caa, given the adaptor's settings.
		"REMOTE_HYPERVISOR_ENDPOINT": {flag: "hypervisor-socket", def: "/run/peerpod/hypervisor.sock"},
		"PODS_DIR":                   {flag: "agent-socket-dir"},
		"PEERPODS_LIMIT_PER_NODE":    {flag: "max-pod-vms", conv: whole, def: "10"},
		// The encoded form (gzip, base64) of the annotation, which
		// --initdata-file reads as it is: the key's file is handed over.
		"INITDATA":      {flag: "initdata-file", file: true},
		"PROXY_TIMEOUT": {flag: "start-vm-timeout", conv: duration},
		"TAGS":          {flag: tagsFlag, conv: tags},
		"FORWARDER_PORT": {same: []string{"15150"},
			why: "caa dials the agent protocol forwarder on port 15150, the pod VM image's default"},
		"TUNNEL_TYPE": {same: []string{"vxlan"}, why: "caa makes VXLAN tunnels only"},
		"VXLAN_PORT":  {same: []string{"4789"}, why: "caa's VXLAN tunnels use UDP port 4789"},
		"TLS_SKIP_VERIFY": {same: []string{"false"},
			why: "caa always verifies the agent's certificate, issued by caa's own agent CA"},
		"CACERT_FILE": {why: "caa issues the agent certificates from its own CA (--agent-ca-dir); custom TLS files are not read"},
		"CERT_FILE":   {why: "caa issues the agent certificates from its own CA (--agent-ca-dir); custom TLS files are not read"},
		"CERT_KEY":    {why: "caa issues the agent certificates from its own CA (--agent-ca-dir); custom TLS files are not read"},
		"TLS_MIN_VERSION": {same: []string{"VersionTLS12"},
			why: "caa's agent TLS takes TLS 1.2 and later; it cannot be raised"},
		"TLS_CIPHER_SUITES":          {why: "caa uses Go's default cipher suites for the agent's TLS"},
		"PAUSE_IMAGE":                {why: "caa passes no pause image to the pod VM"},
		"CLOUD_CONFIG_VERIFY":        {same: []string{"false"}, why: "caa does not sign the VMs' cloud config"},
		"ENABLE_SCRATCH_SPACE":       {same: []string{"false"}, why: "caa gives the pod VMs no encrypted scratch space"},
		"EXTERNAL_NETWORK_VIA_PODVM": {same: []string{"false"}, why: "caa routes no external network through the pod VM"},
		"POD_SUBNET_CIDRS":           {why: "caa routes no local pod subnets through the pod VM"},
	}
	if cloud != "ibmcloud" {
		maps(rules, map[string]rule{
			"ROOT_VOLUME_SIZE": {same: nonEmpty(rootDefault), why: "caa keeps the image's root volume size"},
			"USE_PUBLIC_IP":    {same: []string{"false"}, why: "caa reaches the pod VMs at their private address"},
		})
	}
	switch cloud {
	case "aws":
		maps(rules, map[string]rule{
			"AWS_REGION":          {flag: "aws-region"},
			"AWS_SUBNET_ID":       {flag: "aws-subnet-id"},
			"AWS_SG_IDS":          {flag: "aws-security-group-ids", conv: list},
			"PODVM_AMI_ID":        {flag: "aws-image"},
			"PODVM_INSTANCE_TYPE": {flag: "aws-instance-type", def: "m6a.large"},
			// Upstream's list of the types pods may run on and are fitted
			// to by their requests: caa's table of fitted types.
			"PODVM_INSTANCE_TYPES":      {flag: "instance-types", conv: list},
			"USE_PODVM_LAUNCHTEMPLATE":  {same: []string{"false"}, why: "caa launches each VM with RunInstances, never a launch template"},
			"PODVM_LAUNCHTEMPLATE_NAME": {same: []string{"kata"}, why: "caa launches each VM with RunInstances, never a launch template"},
			"SSH_KP_NAME":               {why: "caa gives the pod VMs no SSH key pair"},
			// peer-pods-secret: the AWS SDK's own variables.
			"AWS_ACCESS_KEY_ID":     {env: "AWS_ACCESS_KEY_ID"},
			"AWS_SECRET_ACCESS_KEY": {env: "AWS_SECRET_ACCESS_KEY"},
			"AWS_SESSION_TOKEN":     {env: "AWS_SESSION_TOKEN"},
		})
	case "azure":
		maps(rules, map[string]rule{
			"AZURE_SUBSCRIPTION_ID": {flag: "azure-subscription-id"},
			"AZURE_REGION":          {flag: "azure-location"},
			"AZURE_RESOURCE_GROUP":  {flag: "azure-resource-group"},
			"AZURE_SUBNET_ID":       {flag: "azure-subnet-id"},
			"AZURE_NSG_ID":          {flag: "azure-security-group-id"},
			"AZURE_IMAGE_ID":        {flag: "azure-image"},
			"AZURE_INSTANCE_SIZE":   {flag: "azure-instance-type", def: "Standard_DC2as_v5"},
			"AZURE_INSTANCE_SIZES":  {flag: "instance-types", conv: list},
			"SSH_USERNAME":          {flag: "azure-admin-username", def: "peerpod"},
			// Secure boot of the confidential VMs, off by default on both.
			"ENABLE_SECURE_BOOT":  {flag: "azure-secure-boot", conv: boolean},
			"AZURE_CLIENT_ID":     {env: "AZURE_CLIENT_ID"},
			"AZURE_CLIENT_SECRET": {env: "AZURE_CLIENT_SECRET"},
			"AZURE_TENANT_ID":     {env: "AZURE_TENANT_ID"},
		})
	case "ibmcloud":
		maps(rules, map[string]rule{
			// Upstream's default on IBM Cloud is a VM that is not confidential.
			"DISABLECVM":            {flag: "confidential", conv: not, def: "true"},
			"IBMCLOUD_VPC_ENDPOINT": {flag: "ibmcloud-endpoint"},
			// Upstream names the token URL itself; caa the IAM service.
			"IBMCLOUD_IAM_ENDPOINT":                {flag: "ibmcloud-iam-endpoint", conv: iamBase},
			"IBMCLOUD_RESOURCE_GROUP_ID":           {flag: "ibmcloud-resource-group-id"},
			"IBMCLOUD_PODVM_INSTANCE_PROFILE_NAME": {flag: "ibmcloud-instance-type"},
			"IBMCLOUD_PODVM_INSTANCE_PROFILE_LIST": {flag: "instance-types", conv: list},
			"IBMCLOUD_ZONE":                        {flag: "ibmcloud-zone"},
			"IBMCLOUD_VPC_SUBNET_ID":               {flag: "ibmcloud-subnet-id"},
			"IBMCLOUD_VPC_ID":                      {flag: "ibmcloud-vpc-id"},
			"IBMCLOUD_SECURITY_GROUP_IDS":          {flag: "ibmcloud-security-group-ids", conv: list},
			"IBMCLOUD_PODVM_IMAGE_ID":              {flag: "ibmcloud-image", conv: one},
			"IBMCLOUD_SSH_KEY_ID":                  {why: "caa gives the pod VMs no SSH key"},
			// The IKS/ROKS cluster whose kube-<id> security group every VM
			// gets; absent, caa reads it from kube-system/cluster-info, as
			// upstream does.
			"IBMCLOUD_CLUSTER_ID": {flag: "ibmcloud-cluster-id"},
			// IBM Cloud's user tags are plain, "key:value" or "tag", not
			// the key=value of the other clouds.
			"TAGS":                              {flag: "ibmcloud-tags", conv: ibmTags},
			"IBMCLOUD_DEDICATED_HOST_IDS":       {why: "caa places no VM on dedicated hosts"},
			"IBMCLOUD_DEDICATED_HOST_GROUP_IDS": {why: "caa places no VM on dedicated hosts"},
			// peer-pods-secret: the API key is handed over as its file.
			"IBMCLOUD_API_KEY": {flag: "ibmcloud-api-key-file", file: true},
			"IBMCLOUD_IAM_PROFILE_ID": {why: "caa's trusted-profile route reads the ServiceAccount token " +
				"(deploy/overlays/ibmcloud-trusted-profile), not upstream's vault token"},
		})
	}
	return rules
}

// otherClouds' keys: named so that one of another cloud is reported as such
// and not as unknown.
func cloudOfKey(key string) string {
	for _, c := range Clouds {
		if _, ok := cloudOnly(c)[key]; ok {
			return c
		}
	}
	return ""
}

// cloudOnly is the keys of cloud that the other two clouds do not have.
func cloudOnly(cloud string) map[string]rule {
	mine := common(cloud)
	out := map[string]rule{}
	for k, r := range mine {
		shared := true
		for _, c := range Clouds {
			if _, ok := common(c)[k]; !ok {
				shared = false
			}
		}
		if !shared {
			out[k] = r
		}
	}
	return out
}

func maps(dst, src map[string]rule) {
	for k, v := range src {
		dst[k] = v
	}
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// not inverts a boolean: DISABLECVM=true is --confidential=false.
func not(v string) (string, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return "", fmt.Errorf("%q is not a boolean (true or false)", v)
	}
	return strconv.FormatBool(!b), nil
}

func boolean(v string) (string, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return "", fmt.Errorf("%q is not a boolean (true or false)", v)
	}
	return strconv.FormatBool(b), nil
}

func whole(v string) (string, error) {
	if _, err := strconv.Atoi(v); err != nil {
		return "", fmt.Errorf("%q is not a whole number", v)
	}
	return v, nil
}

func duration(v string) (string, error) {
	if _, err := time.ParseDuration(v); err != nil {
		return "", fmt.Errorf("%q is not a duration such as 5m", v)
	}
	return v, nil
}

// list normalises a comma-separated list (upstream trims nothing; caa's
// flags take the same form).
func list(v string) (string, error) {
	var out []string
	for item := range strings.SplitSeq(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return strings.Join(out, ","), nil
}

// one refuses a list where caa takes one value.
func one(v string) (string, error) {
	l, _ := list(v)
	if strings.Contains(l, ",") {
		return "", fmt.Errorf("%q names several images; caa takes one default image (pods may ask for others listed in --allowed-images)", v)
	}
	return l, nil
}

var tagPair = regexp.MustCompile(`^[^=,]+=[^,]*$`)

// tags checks upstream's key=value,key2=value2 form, which caa's tag flags
// take as it is.
func tags(v string) (string, error) {
	l, _ := list(v)
	for item := range strings.SplitSeq(l, ",") {
		if !tagPair.MatchString(item) {
			return "", fmt.Errorf("tag %q is not key=value", item)
		}
	}
	return l, nil
}

// ibmTags turns upstream's IBM Cloud TAGS, a list of user tags as IBM
// writes them ("env:prod,team"), into caa's key=value form: "k:v" is k=v,
// a bare tag is tag= (caa attaches it as "tag:"). A "=" is refused: IBM's
// tags cannot hold one, so the value was meant for another cloud.
func ibmTags(v string) (string, error) {
	l, _ := list(v)
	if l == "" {
		return "", nil
	}
	var out []string
	for item := range strings.SplitSeq(l, ",") {
		k, val, _ := strings.Cut(item, ":")
		k, val = strings.TrimSpace(k), strings.TrimSpace(val)
		switch {
		case strings.Contains(item, "="):
			return "", fmt.Errorf("tag %q holds '=': IBM Cloud's tags are key:value or a plain tag, e.g. env:prod,team", item)
		case k == "":
			return "", fmt.Errorf("tag %q has no key before ':'", item)
		}
		out = append(out, k+"="+val)
	}
	return strings.Join(out, ","), nil
}

// iamBase turns upstream's IAM token URL (https://iam.cloud.ibm.com/identity/token)
// into the service URL caa's IBM SDK authenticator appends that path to.
func iamBase(v string) (string, error) {
	u, err := url.Parse(v)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("%q is not an https URL", v)
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/identity/token")
	return u.String(), nil
}
