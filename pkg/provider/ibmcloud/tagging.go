package ibmcloud

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/platform-services-go-sdk/globaltaggingv1"

	"github.com/caa-project/caa/pkg/provider"
)

// taggingAPI is the part of globaltaggingv1.GlobalTaggingV1 the provider
// uses.
type taggingAPI interface {
	AttachTagWithContext(context.Context, *globaltaggingv1.AttachTagOptions) (*globaltaggingv1.TagResults, *core.DetailedResponse, error)
	ListTagsWithContext(context.Context, *globaltaggingv1.ListTagsOptions) (*globaltaggingv1.TagList, *core.DetailedResponse, error)
}

// attachTags attaches userTags (as encodeUserTags wrote them) to the
// instance crn as user tags, through Global Tagging: VPC's create takes
// tags for the boot volume only, and the instance's own tags are what
// List finds it and reads its state by in the search index. Attaching a
// tag the instance already has changes nothing, so a retry is harmless.
// The service answers 200 with a per-resource is_error; that is a failure
// too.
func (p *Provider) attachTags(ctx context.Context, crn string, userTags []string) error {
	if crn == "" {
		return &provider.Error{Provider: providerName, Op: opCreate, Code: "no_crn", Message: "the created instance has no CRN to tag"}
	}
	opts := &globaltaggingv1.AttachTagOptions{
		Resources: []globaltaggingv1.Resource{{ResourceID: ptr(crn)}},
		TagNames:  userTags,
		TagType:   ptr(globaltaggingv1.AttachTagOptionsTagTypeUserConst),
	}
	if p.cfg.AccountID != "" {
		opts.AccountID = ptr(p.cfg.AccountID)
	}
	res, resp, err := call(ctx, p.cfg.WriteTimeout, provider.DefaultWriteTimeout, func(ctx context.Context) (*globaltaggingv1.TagResults, *core.DetailedResponse, error) {
		return p.tags.AttachTagWithContext(ctx, opts)
	})
	if err != nil {
		return classify(opCreate, resp, fmt.Errorf("attach caa's tags to instance %s through Global Tagging: %w", crn, err))
	}
	for _, r := range res.Results {
		if r.IsError != nil && *r.IsError {
			return &provider.Error{Provider: providerName, Op: opCreate, Code: "tag_attach_failed",
				Message: fmt.Sprintf("Global Tagging did not tag instance %s: %s", crn, str(r.Message))}
		}
	}
	return nil
}

// tagOrLog attaches the tags and logs a failure instead of returning it:
// the VM stays findable by its boot volume, and the next List of its node
// attaches them.
func (p *Provider) tagOrLog(ctx context.Context, crn string, userTags []string) {
	if err := p.attachTags(ctx, crn, userTags); err != nil {
		p.logger().Warn("cannot tag the instance through Global Tagging yet; the node's next listing tries again", "crn", crn, "err", err)
	}
}

func (p *Provider) logger() *slog.Logger {
	if p.log == nil {
		return slog.Default()
	}
	return p.log
}
