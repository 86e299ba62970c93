package vpcfake

import (
	"fmt"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// CIData is the cloud-init NoCloud volume (label cidata) instance
// instanceID of c boots with, as the peer-pods image on IBM Cloud VPC reads
// its user data: the files user-data (the instance's user_data as created,
// byte for byte) and meta-data (its instance id), which the image finds
// mounted at /media/cidata.
func CIData(c *cloud.Cloud, instanceID string) (map[string][]byte, error) {
	in, err := c.Get(instanceID)
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", instanceID, err)
	}
	return map[string][]byte{
		"user-data": in.UserData(),
		"meta-data": []byte("instance-id: " + in.ID + "\nlocal-hostname: " + in.Name + "\n"),
	}, nil
}
