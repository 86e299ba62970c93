package rollout

// The pieces of a test overlay on deploy/overlays/aws that the rollout
// tests of this package and the kata rollout test of test/e2e share.

// FakeEC2Literals are entries of a caa-config generator's literals:
// that point the shipped caa at a fake EC2: its region, subnet, security
// group, image and instance type, its endpoint left as {{ENDPOINT}} for the caller to
// fill in, and no instance metadata service (the credentials come from
// the Secret of CredentialsSecret); one entry a line, the last without
// its line break.
func FakeEC2Literals(image, instanceType string) string {
	return `      - CAA_AWS_REGION=us-east-1
      - CAA_AWS_SUBNET_ID=subnet-0123456789abcdef0
      - CAA_AWS_SECURITY_GROUP_IDS=sg-0123456789abcdef0
      - CAA_AWS_IMAGE=` + image + `
      - CAA_AWS_INSTANCE_TYPE=` + instanceType + `
      - CAA_AWS_ENDPOINT={{ENDPOINT}}
      - AWS_EC2_METADATA_DISABLED=true`
}

// FastProbesPatch is an entry of a kustomization's patches: list: the caa
// DaemonSet's startup and readiness probes run every second instead of
// every 10s and 5s, so the DaemonSet controller moves on as soon as a pod
// turns Ready, and a 5s period adds nothing to a test but up to 5s per
// node. Thresholds are unchanged.
const FastProbesPatch = `  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata:
        name: caa
        namespace: caa-system
      spec:
        template:
          spec:
            containers:
              - name: caa
                startupProbe:
                  periodSeconds: 1
                readinessProbe:
                  periodSeconds: 1
`

// CredentialsSecret is the overlay's credentials.yaml: the Secret the
// shipped DaemonSet reads its AWS keys from, with these (fake) keys.
func CredentialsSecret(accessKey, secretKey string) string {
	return `apiVersion: v1
kind: Secret
metadata:
  name: caa-cloud-credentials
  namespace: caa-system
type: Opaque
stringData:
  AWS_ACCESS_KEY_ID: ` + accessKey + `
  AWS_SECRET_ACCESS_KEY: ` + secretKey + `
`
}
