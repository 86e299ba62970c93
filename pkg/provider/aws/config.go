package aws

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/caa-project/caa/pkg/provider"
)

const (
	defaultMaxAttempts = 3
	defaultMaxBackoff  = 5 * time.Second
	maxMaxAttempts     = 10
	maxTagKey          = 128
	// maxExtraTags leaves room, within EC2's 50 tags, for the six identity
	// tags and Name.
	maxExtraTags = 50 - 7
)

var (
	subnetPattern = regexp.MustCompile(`^subnet-[0-9a-f]{8,17}$`)
	groupPattern  = regexp.MustCompile(`^sg-[0-9a-f]{8,17}$`)
)

// Config is the EC2 provider's configuration. AddFlags fills it from flags
// whose defaults come from the environment; credentials are not part of it
// (they come from the SDK's default chain).
type Config struct {
	// Region is the EC2 region (required).
	Region string
	// SubnetID places every VM's primary interface, and so its VPC and
	// zone (required).
	SubnetID string
	// SecurityGroupIDs go on every VM. Empty: FillFromIMDS takes the
	// worker's own (never the VPC's default group, which admits only its
	// own members). The same for an empty Region or SubnetID.
	SecurityGroupIDs []string
	// IMDSEndpoint overrides the instance metadata service's URL that
	// FillFromIMDS reads (tests); empty: the SDK's
	// (AWS_EC2_METADATA_SERVICE_ENDPOINT, else 169.254.169.254).
	IMDSEndpoint string
	// Image and InstanceType fill a spec that names none (the node's defaults).
	Image        string
	InstanceType string
	// ExtraTags go on every VM and root volume, under caa's own tags.
	ExtraTags map[string]string
	// Endpoint overrides the EC2 endpoint URL (fake clouds, private
	// endpoints). Empty: the SDK resolves it, honouring AWS_ENDPOINT_URL_EC2.
	Endpoint string
	// MaxAttempts bounds the SDK's attempts per call for 5xx and network
	// errors (0: 3). MaxBackoff caps the wait between them (0: 5s).
	MaxAttempts int
	MaxBackoff  time.Duration
	// ReadTimeout bounds each read call (one DescribeInstances page, its
	// retries included); 0: provider.DefaultReadTimeout (30s).
	// WriteTimeout bounds each RunInstances or TerminateInstances call;
	// 0: provider.DefaultWriteTimeout (2m). A call past its timeout fails
	// with context.DeadlineExceeded, transient.
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// Logger receives the SDK's retry notices at debug level; nil: none.
	Logger *slog.Logger

	// envErrs are environment defaults AddFlags could not parse.
	envErrs []error
}

// setting names one configuration value as flag and environment variable.
type setting string

func (s setting) flag() string { return "aws-" + string(s) }
func (s setting) env() string {
	return "CAA_AWS_" + strings.ToUpper(strings.ReplaceAll(string(s), "-", "_"))
}
func (s setting) both() string { return "--" + s.flag() + " or " + s.env() }

const (
	setRegion       setting = "region"
	setSubnet       setting = "subnet-id"
	setGroups       setting = "security-group-ids"
	setImage        setting = "image"
	setInstanceType setting = "instance-type"
	setExtraTags    setting = "tags"
	setEndpoint     setting = "endpoint"
	setMaxAttempts  setting = "max-attempts"
	setMaxBackoff   setting = "max-backoff"
	setReadTimeout  setting = "read-timeout"
	setWriteTimeout setting = "write-timeout"
)

// AddFlags registers the --aws-* flags on fs, each defaulting to its
// CAA_AWS_* environment variable (the region also to AWS_REGION).
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	region := os.Getenv(setRegion.env())
	if region == "" {
		region = os.Getenv("AWS_REGION")
	}
	fs.StringVar(&c.Region, setRegion.flag(), region, "EC2 region (env "+setRegion.env()+", then AWS_REGION; empty: the worker's, from instance metadata)")
	fs.StringVar(&c.SubnetID, setSubnet.flag(), os.Getenv(setSubnet.env()), "subnet of every VM (env "+setSubnet.env()+"; empty: the worker's, from instance metadata)")
	fs.StringSliceVar(&c.SecurityGroupIDs, setGroups.flag(), provider.SplitList(os.Getenv(setGroups.env())),
		"comma-separated security groups of every VM; they must admit TCP 15150 and UDP 4789 from the workers (env "+setGroups.env()+"; empty: the worker's own, from instance metadata)")
	fs.StringVar(&c.Image, setImage.flag(), os.Getenv(setImage.env()), "AMI for pods that name none (env "+setImage.env()+")")
	fs.StringVar(&c.InstanceType, setInstanceType.flag(), os.Getenv(setInstanceType.env()),
		"instance type for pods that name none (env "+setInstanceType.env()+")")
	fs.StringToStringVar(&c.ExtraTags, setExtraTags.flag(), c.envTags(), "key=value tags added to every VM (env "+setExtraTags.env()+")")
	fs.StringVar(&c.Endpoint, setEndpoint.flag(), os.Getenv(setEndpoint.env()), "EC2 endpoint URL override (env "+setEndpoint.env()+")")
	fs.IntVar(&c.MaxAttempts, setMaxAttempts.flag(), c.envInt(setMaxAttempts, defaultMaxAttempts),
		"attempts per EC2 call for 5xx and network errors; throttling is never retried (env "+setMaxAttempts.env()+")")
	fs.DurationVar(&c.MaxBackoff, setMaxBackoff.flag(), c.envDuration(setMaxBackoff, defaultMaxBackoff),
		"longest wait between attempts (env "+setMaxBackoff.env()+")")
	fs.DurationVar(&c.ReadTimeout, setReadTimeout.flag(), c.envDuration(setReadTimeout, provider.DefaultReadTimeout),
		"deadline of each read call to EC2, its retries included (env "+setReadTimeout.env()+")")
	fs.DurationVar(&c.WriteTimeout, setWriteTimeout.flag(), c.envDuration(setWriteTimeout, provider.DefaultWriteTimeout),
		"deadline of each launch or terminate call to EC2, its retries included (env "+setWriteTimeout.env()+")")
}

func (c *Config) envTags() map[string]string {
	tags, err := provider.ParseTags(os.Getenv(setExtraTags.env()))
	if err != nil {
		c.envErrs = append(c.envErrs, fmt.Errorf("aws: %s: %w", setExtraTags.env(), err))
		return map[string]string{}
	}
	return tags
}

func (c *Config) envInt(s setting, def int) int {
	raw := os.Getenv(s.env())
	if raw == "" {
		return def
	}
	n, err := strconv.Atoi(raw)
	if err != nil {
		c.envErrs = append(c.envErrs, fmt.Errorf("aws: %s=%q is not a whole number", s.env(), raw))
		return def
	}
	return n
}

func (c *Config) envDuration(s setting, def time.Duration) time.Duration {
	raw := os.Getenv(s.env())
	if raw == "" {
		return def
	}
	d, err := time.ParseDuration(raw)
	if err != nil {
		c.envErrs = append(c.envErrs, fmt.Errorf("aws: %s=%q is not a duration like 5s", s.env(), raw))
		return def
	}
	return d
}

// Validate reports every missing or malformed setting, each naming its
// flag and environment variable.
func (c Config) Validate() error {
	errs := append([]error(nil), c.envErrs...)
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("aws: "+format, args...)) }
	if c.Region == "" {
		bad("no region: set %s (or AWS_REGION)", setRegion.both())
	}
	switch {
	case c.SubnetID == "":
		bad("no subnet: set %s", setSubnet.both())
	case !subnetPattern.MatchString(c.SubnetID):
		bad("%s: %q is not a subnet id (subnet-...)", setSubnet.both(), c.SubnetID)
	}
	for _, g := range c.SecurityGroupIDs {
		if !groupPattern.MatchString(g) {
			bad("%s: %q is not a security group id (sg-...)", setGroups.both(), g)
		}
	}
	if c.Endpoint != "" {
		if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("%s: %q is not an http(s) URL", setEndpoint.both(), c.Endpoint)
		}
	}
	if c.MaxAttempts < 0 || c.MaxAttempts > maxMaxAttempts {
		bad("%s: %d is not between 1 and %d (0 for the default, %d)", setMaxAttempts.both(), c.MaxAttempts, maxMaxAttempts, defaultMaxAttempts)
	}
	for _, d := range []struct {
		s setting
		v time.Duration
	}{{setMaxBackoff, c.MaxBackoff}, {setReadTimeout, c.ReadTimeout}, {setWriteTimeout, c.WriteTimeout}} {
		if d.v < 0 {
			bad("%s: %s is negative", d.s.both(), d.v)
		}
	}
	if len(c.ExtraTags) > maxExtraTags {
		bad("%s: %d tags, at most %d", setExtraTags.both(), len(c.ExtraTags), maxExtraTags)
	}
	for k, v := range c.ExtraTags {
		switch {
		case k == "" || utf8.RuneCountInString(k) > maxTagKey:
			bad("%s: tag key %q must have 1 to %d characters", setExtraTags.both(), k, maxTagKey)
		case strings.HasPrefix(strings.ToLower(k), "aws:"):
			bad("%s: tag key %q: the aws: prefix is reserved by AWS", setExtraTags.both(), k)
		case k == tagName || strings.HasPrefix(k, "caa-"):
			bad("%s: tag key %q is set by caa itself", setExtraTags.both(), k)
		case utf8.RuneCountInString(v) > maxTagValue:
			bad("%s: the value of tag %q is longer than %d characters", setExtraTags.both(), k, maxTagValue)
		}
	}
	return errors.Join(errs...)
}
