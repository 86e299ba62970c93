package aws

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"

	"github.com/caa-project/caa/internal/awsbody"
)

// newClient builds the EC2 client: credentials and shared settings from
// the SDK's default chain, region, endpoint and retries from cfg.
func newClient(ctx context.Context, cfg Config) (*ec2.Client, error) {
	awsCfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(cfg.Region))
	if err != nil {
		return nil, fmt.Errorf("aws: load the SDK's default configuration: %w", err)
	}
	attempts, backoff := cfg.MaxAttempts, cfg.MaxBackoff
	if attempts == 0 {
		attempts = defaultMaxAttempts
	}
	if backoff == 0 {
		backoff = defaultMaxBackoff
	}
	return ec2.NewFromConfig(awsCfg, func(o *ec2.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = awssdk.String(cfg.Endpoint)
		}
		// smithy-go closes a request body net/http may still read (awsbody).
		o.HTTPClient = awsbody.Detach(o.HTTPClient)
		o.Retryer = newRetryer(attempts, backoff)
		// The retryer above decides; AWS_MAX_ATTEMPTS must not wrap it.
		o.RetryMaxAttempts = 0
		o.Logger, o.ClientLogMode = logging.Nop{}, 0
		if cfg.Logger != nil {
			// Retry notices only: request and response logging would write
			// signed headers and user data.
			o.Logger, o.ClientLogMode = sdkLogger{cfg.Logger}, awssdk.LogRetries
		}
	}), nil
}

// newRetryer is the SDK's standard retryer for up to maxAttempts attempts,
// which never retries an error caa classifies (throttling above all) and
// has no client-side retry quota.
func newRetryer(maxAttempts int, maxBackoff time.Duration) awssdk.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = maxAttempts
		o.MaxBackoff = maxBackoff
		o.RateLimiter = ratelimit.None
		o.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(vetoClassified)}, o.Retryables...)
	})
}

// vetoClassified refuses a retry of any error whose code has a kind: those
// are the caller's to handle (throttling with its Retry-After, capacity,
// quota...). It leaves the rest to the SDK's own rules.
func vetoClassified(err error) awssdk.Ternary {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && kindOf(apiErr.ErrorCode()) != nil {
		return awssdk.FalseTernary
	}
	return awssdk.UnknownTernary
}

// sdkLogger hands the SDK's log lines to slog.
type sdkLogger struct{ l *slog.Logger }

func (s sdkLogger) Logf(c logging.Classification, format string, v ...any) {
	level := slog.LevelDebug
	if c == logging.Warn {
		level = slog.LevelWarn
	}
	s.l.Log(context.Background(), level, fmt.Sprintf(format, v...), "provider", Name)
}
