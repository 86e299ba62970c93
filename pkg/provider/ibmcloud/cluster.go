package ibmcloud

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"

	"github.com/caa-project/caa/pkg/provider"
)

// IBM Cloud's Kubernetes service (IKS, and ROKS, its OpenShift) makes a
// security group kube-<cluster id> in the cluster's VPC and attaches it to
// every worker; it lets the workers reach each other. A pod VM outside it
// has the VPC's default group, which does not admit the worker's
// connections to the agent's forwarder (TCP 15150) and the VXLAN tunnel
// (UDP 4789): the VM boots and is never reached. Upstream's adaptor always
// adds the group, finding the cluster id in the ConfigMap cluster-info of
// kube-system (key cluster_id, else the cluster_id field of the JSON under
// cluster-config.json; src/cloud-providers/ibmcloud/provider.go,
// getClusterID). caa does the same on a cluster that has the ConfigMap,
// or with --ibmcloud-cluster-id.

// The ConfigMap the service writes into every cluster it runs.
const (
	ClusterInfoNamespace = "kube-system"
	ClusterInfoName      = "cluster-info"
)

// ClusterIDOf reads the cluster id from cluster-info's data, as upstream's
// adaptor does: the key cluster_id, else the field cluster_id of the JSON
// document under cluster-config.json.
func ClusterIDOf(data map[string]string) (string, error) {
	where := ClusterInfoNamespace + "/" + ClusterInfoName
	if id := data["cluster_id"]; id != "" {
		return id, nil
	}
	doc, ok := data["cluster-config.json"]
	if !ok {
		return "", fmt.Errorf("ibmcloud: ConfigMap %s has neither cluster_id nor cluster-config.json: set --ibmcloud-cluster-id (env CAA_IBMCLOUD_CLUSTER_ID)", where)
	}
	var cfg struct {
		ClusterID string `json:"cluster_id"`
	}
	if err := json.Unmarshal([]byte(doc), &cfg); err != nil {
		return "", fmt.Errorf("ibmcloud: ConfigMap %s: cluster-config.json is not a JSON object with a string cluster_id (%v): set --ibmcloud-cluster-id (env CAA_IBMCLOUD_CLUSTER_ID)", where, err)
	}
	if cfg.ClusterID == "" {
		return "", fmt.Errorf("ibmcloud: ConfigMap %s: cluster-config.json has no cluster_id: set --ibmcloud-cluster-id (env CAA_IBMCLOUD_CLUSTER_ID)", where)
	}
	return cfg.ClusterID, nil
}

// ClusterSecurityGroupName is the name of the security group IBM Cloud's
// Kubernetes service gives a cluster's workers.
func ClusterSecurityGroupName(clusterID string) string { return "kube-" + clusterID }

// AddClusterSecurityGroup finds the security group kube-<clusterID> in the
// VMs' VPC (the configured one, else the subnet's) by listing the VPC's
// groups, once, and adds it to every later create's network attachment
// beside --ibmcloud-security-group-ids. Call it once, before the first
// create. A VPC without the group is an error naming the flags: a VM
// without it could not be reached from the workers. It returns the
// group's id.
func (p *Provider) AddClusterSecurityGroup(ctx context.Context, clusterID string) (string, error) {
	name := ClusterSecurityGroupName(clusterID)
	vpc := p.cfg.VPCID
	if vpc == "" {
		sub, err := read(ctx, p, "is.subnet.subnet.read", "subnet "+p.cfg.SubnetID, "--ibmcloud-subnet-id",
			func(ctx context.Context) (*vpcv1.Subnet, *core.DetailedResponse, error) {
				return p.api.GetSubnetWithContext(ctx, &vpcv1.GetSubnetOptions{ID: ptr(p.cfg.SubnetID)})
			})
		if err != nil {
			return "", fmt.Errorf("ibmcloud: the VPC to find security group %s in: %w", name, err)
		}
		if sub.VPC == nil || str(sub.VPC.ID) == "" {
			return "", fmt.Errorf("ibmcloud: subnet %s shows no VPC to find security group %s in: set --ibmcloud-vpc-id", p.cfg.SubnetID, name)
		}
		vpc = str(sub.VPC.ID)
	}
	pager, err := p.api.NewSecurityGroupsPager(&vpcv1.ListSecurityGroupsOptions{VPCID: ptr(vpc), Limit: ptr(int64(pageLimit))})
	if err != nil {
		return "", classify(opPreflight, nil, err)
	}
	id := ""
	err = pages(ctx, p.cfg.ReadTimeout, pager.HasNext, pager.GetNextWithContext, func(g vpcv1.SecurityGroup) string {
		if str(g.Name) == name && id == "" {
			id = str(g.ID)
		}
		return str(g.ID)
	})
	if err != nil {
		return "", fmt.Errorf("ibmcloud: listing the security groups of VPC %s for %s (grant is.security-group.security-group.list to caa's identity): %w", vpc, name, err)
	}
	if id == "" {
		return "", &provider.Error{Kind: provider.ErrInvalidSpec, Provider: providerName, Op: opPreflight, Code: "not_found",
			Message: fmt.Sprintf("VPC %s has no security group %s, which IBM Cloud's Kubernetes service gives cluster %s's workers; "+
				"without it the workers cannot reach a pod VM (TCP 15150, UDP 4789): correct --ibmcloud-cluster-id (env CAA_IBMCLOUD_CLUSTER_ID), "+
				"or list a group that admits the workers in --ibmcloud-security-group-ids and set --ibmcloud-cluster-id=none", vpc, name, clusterID)}
	}
	if !slices.Contains(p.cfg.SecurityGroupIDs, id) {
		p.cfg.SecurityGroupIDs = append(slices.Clone(p.cfg.SecurityGroupIDs), id)
	}
	return id, nil
}
