// Package agentproto speaks the few calls of kata's agent protocol that caa and
// its fake pod VM need: the health check and a long-lived wait.
//
// Names and field numbers as kata-containers defines them (confirmed
// 2026-12-01 at 7c6ba40c, src/libs/protocols/protos/health.proto and
// agent.proto): package grpc; service Health { Check(CheckRequest) returns
// (HealthCheckResponse) }, CheckRequest{string service = 1},
// HealthCheckResponse{ServingStatus status = 1} with SERVING = 1; service
// AgentService { WaitProcess(WaitProcessRequest) returns (WaitProcessResponse) },
// WaitProcessRequest{string container_id = 1; string exec_id = 2},
// WaitProcessResponse{int32 status = 1}. The ttrpc method path is
// /grpc.Health/Check and /grpc.AgentService/WaitProcess.
//
// The messages are built at run time from a descriptor written here (kata's Go
// module is not available to caa), and are not registered globally, so they
// cannot clash with any generated code.
package agentproto

import (
	"context"
	"fmt"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Service and method names of kata's agent protocol.
const (
	HealthService     = "grpc.Health"
	CheckMethod       = "Check"
	AgentService      = "grpc.AgentService"
	WaitProcessMethod = "WaitProcess"
)

// Serving is HealthCheckResponse.ServingStatus SERVING.
const Serving = 1

var (
	checkRequest, healthCheckResponse, waitProcessRequest, waitProcessResponse protoreflect.MessageDescriptor
)

func init() {
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
	i32 := descriptorpb.FieldDescriptorProto_TYPE_INT32.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	field := func(name string, num int32, typ *descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(num), Type: typ, Label: opt, JsonName: proto.String(name)}
	}
	msg := func(name string, fields ...*descriptorpb.FieldDescriptorProto) *descriptorpb.DescriptorProto {
		return &descriptorpb.DescriptorProto{Name: proto.String(name), Field: fields}
	}
	fd := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("caa/internal/agentproto/agent_subset.proto"),
		Package: proto.String("grpc"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			msg("CheckRequest", field("service", 1, str)),
			// The enum travels as a varint; an int32 reads it identically.
			msg("HealthCheckResponse", field("status", 1, i32)),
			msg("WaitProcessRequest", field("container_id", 1, str), field("exec_id", 2, str)),
			msg("WaitProcessResponse", field("status", 1, i32)),
		},
	}
	file, err := protodesc.NewFile(fd, nil)
	if err != nil {
		panic(fmt.Sprintf("agentproto: descriptor: %v", err))
	}
	m := file.Messages()
	checkRequest, healthCheckResponse = m.ByName("CheckRequest"), m.ByName("HealthCheckResponse")
	waitProcessRequest, waitProcessResponse = m.ByName("WaitProcessRequest"), m.ByName("WaitProcessResponse")
}

func newMsg(d protoreflect.MessageDescriptor, kv ...any) *dynamicpb.Message {
	m := dynamicpb.NewMessage(d)
	for i := 0; i < len(kv); i += 2 {
		m.Set(d.Fields().ByName(protoreflect.Name(kv[i].(string))), protoreflect.ValueOf(kv[i+1]))
	}
	return m
}

func getInt(m *dynamicpb.Message, name string) int32 {
	return int32(m.Get(m.Descriptor().Fields().ByName(protoreflect.Name(name))).Int())
}

func getString(m *dynamicpb.Message, name string) string {
	return m.Get(m.Descriptor().Fields().ByName(protoreflect.Name(name))).String()
}

// NewCheckRequest builds a health check for service ("" is the agent itself).
func NewCheckRequest(service string) *dynamicpb.Message {
	return newMsg(checkRequest, "service", service)
}

// NewHealthCheckResponse builds a health answer with status.
func NewHealthCheckResponse(status int32) *dynamicpb.Message {
	return newMsg(healthCheckResponse, "status", status)
}

// NewWaitProcessRequest builds a wait for a container's process.
func NewWaitProcessRequest(containerID, execID string) *dynamicpb.Message {
	return newMsg(waitProcessRequest, "container_id", containerID, "exec_id", execID)
}

// NewWaitProcessResponse builds a wait's answer: the process's exit status.
func NewWaitProcessResponse(status int32) *dynamicpb.Message {
	return newMsg(waitProcessResponse, "status", status)
}

// Status reads the status field of a HealthCheckResponse or WaitProcessResponse.
func Status(m *dynamicpb.Message) int32 { return getInt(m, "status") }

// ContainerID reads a WaitProcessRequest's container_id.
func ContainerID(m *dynamicpb.Message) string { return getString(m, "container_id") }

// Check calls the agent's health check over c and returns its status.
func Check(ctx context.Context, c *ttrpc.Client) (int32, error) {
	resp := NewHealthCheckResponse(0)
	if err := c.Call(ctx, HealthService, CheckMethod, NewCheckRequest(""), resp); err != nil {
		return 0, fmt.Errorf("agent health check: %w", err)
	}
	return Status(resp), nil
}

// WaitProcess calls the agent's WaitProcess, which answers when the process
// ends: the long-lived call the kata shim keeps open per container.
func WaitProcess(ctx context.Context, c *ttrpc.Client, containerID, execID string) (int32, error) {
	resp := NewWaitProcessResponse(0)
	if err := c.Call(ctx, AgentService, WaitProcessMethod, NewWaitProcessRequest(containerID, execID), resp); err != nil {
		return 0, fmt.Errorf("agent wait process %s: %w", containerID, err)
	}
	return Status(resp), nil
}

func emptyOf(d protoreflect.MessageDescriptor) *dynamicpb.Message { return dynamicpb.NewMessage(d) }

// EmptyCheckRequest is what a server unmarshals a Check request into.
func EmptyCheckRequest() *dynamicpb.Message { return emptyOf(checkRequest) }

// EmptyWaitProcessRequest is what a server unmarshals a WaitProcess request into.
func EmptyWaitProcessRequest() *dynamicpb.Message { return emptyOf(waitProcessRequest) }
