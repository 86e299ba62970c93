//go:build caa_ibmcloud || !(caa_aws || caa_azure || caa_ibmcloud)

package clouds

import (
	"context"
	"fmt"
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
)

func ibmcloudCloud() *Cloud {
	cfg := &ibmcloud.Config{}
	var kube kubernetes.Interface
	node := ""
	return &Cloud{
		Name:       "ibmcloud",
		AddFlags:   cfg.AddFlags,
		Types:      ibmcloud.InstanceTypes,
		TEEs:       ibmcloud.TEEs,
		Configured: func() Defaults { return Defaults{InstanceType: cfg.InstanceType, Image: cfg.Image} },
		TypeFlag:   "--ibmcloud-instance-type", ImageFlag: "--ibmcloud-image",
		UseCluster: func(c kubernetes.Interface, n string) { kube, node = c, n },
		Open: func(ctx context.Context, log *slog.Logger) (provider.Provider, Defaults, error) {
			if kube != nil && node != "" {
				placeFromNode(ctx, kube, node, cfg, log)
			}
			if err := cfg.Validate(); err != nil {
				return nil, Defaults{}, err
			}
			p, err := ibmcloud.New(ctx, *cfg)
			if err != nil {
				return nil, Defaults{}, err
			}
			log.Info("ibmcloud credentials", "route", p.Credentials())
			if kube != nil {
				if err := joinClusterGroup(ctx, kube, p, cfg.ClusterID, log); err != nil {
					return nil, Defaults{}, err
				}
			}
			return p, Defaults{InstanceType: cfg.InstanceType, Image: cfg.Image}, nil
		},
	}
}

// The labels IBM Cloud's Kubernetes service puts on its workers, which
// upstream's adaptor reads (src/cloud-providers/ibmcloud/provider.go,
// NewProvider): a subnet label marks a worker of the service.
const (
	labelZone          = "topology.kubernetes.io/zone"
	labelRegion        = "topology.kubernetes.io/region"
	labelSubnet        = "ibm-provider.kubernetes.io/subnet-id"
	labelSubnetClassic = "ibm-cloud.kubernetes.io/subnet-id"
)

// placeFromNode fills the settings left unset from the node's labels, as
// upstream's adaptor does: the region from topology.kubernetes.io/region;
// on a worker of IBM Cloud's Kubernetes service (it has a subnet label)
// the zone from topology.kubernetes.io/zone and the subnet from the
// label (the VPC follows from the subnet). A Node that cannot be read is
// logged and leaves the settings to the flags, whose check names them.
func placeFromNode(ctx context.Context, kube kubernetes.Interface, node string, cfg *ibmcloud.Config, log *slog.Logger) {
	if cfg.Region != "" && cfg.Zone != "" && cfg.SubnetID != "" {
		return
	}
	n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		log.Warn("ibmcloud: the node's labels could not be read to fill the region, zone and subnet left unset", "node", node, "err", err)
		return
	}
	from := map[string]string{}
	set := func(field *string, flag, label string) {
		if *field == "" && n.Labels[label] != "" {
			*field = n.Labels[label]
			from[flag] = label + "=" + *field
		}
	}
	if cfg.Endpoint == "" {
		set(&cfg.Region, "--ibmcloud-region", labelRegion)
	}
	subnet := labelSubnet
	if n.Labels[subnet] == "" {
		subnet = labelSubnetClassic
	}
	if n.Labels[subnet] != "" {
		set(&cfg.Zone, "--ibmcloud-zone", labelZone)
		set(&cfg.SubnetID, "--ibmcloud-subnet-id", subnet)
	}
	if len(from) > 0 {
		log.Info("ibmcloud: settings from the node's labels", "node", node, "from", from)
	}
}

// joinClusterGroup adds the cluster's security group kube-<id> to every
// VM (ibmcloud/cluster.go): the id is --ibmcloud-cluster-id, else read from
// kube-system/cluster-info; a cluster without that ConfigMap is not one of
// IBM Cloud's Kubernetes service and gets no group.
func joinClusterGroup(ctx context.Context, kube kubernetes.Interface, p *ibmcloud.Provider, clusterID string, log *slog.Logger) error {
	if clusterID == ibmcloud.ClusterIDNone {
		log.Info("ibmcloud: no cluster security group (--ibmcloud-cluster-id=none): --ibmcloud-security-group-ids must admit the workers")
		return nil
	}
	if clusterID == "" {
		cm, err := kube.CoreV1().ConfigMaps(ibmcloud.ClusterInfoNamespace).Get(ctx, ibmcloud.ClusterInfoName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			log.Info("ibmcloud: no ConfigMap kube-system/cluster-info, so not a cluster of IBM Cloud's Kubernetes service: no cluster security group; --ibmcloud-security-group-ids must admit the workers")
			return nil
		case apierrors.IsForbidden(err):
			return fmt.Errorf("ibmcloud: reading ConfigMap %s/%s, for the cluster's security group, was refused: apply the Role caa-cluster-info "+
				"(deploy/overlays/ibmcloud, or the chart with cloud ibmcloud), or set --ibmcloud-cluster-id (env CAA_IBMCLOUD_CLUSTER_ID): %w",
				ibmcloud.ClusterInfoNamespace, ibmcloud.ClusterInfoName, err)
		case err != nil:
			return fmt.Errorf("ibmcloud: reading ConfigMap %s/%s for the cluster's security group: %w", ibmcloud.ClusterInfoNamespace, ibmcloud.ClusterInfoName, err)
		}
		if clusterID, err = ibmcloud.ClusterIDOf(configMapData(cm)); err != nil {
			return err
		}
	}
	id, err := p.AddClusterSecurityGroup(ctx, clusterID)
	if err != nil {
		return err
	}
	log.Info("ibmcloud: every VM joins the cluster's security group", "group", ibmcloud.ClusterSecurityGroupName(clusterID), "id", id)
	return nil
}

func configMapData(cm *corev1.ConfigMap) map[string]string {
	if cm == nil {
		return nil
	}
	return cm.Data
}
