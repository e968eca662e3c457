package main

import (
	"context"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// machineServer is one node's MachineService: only the calls the runbook makes; the rest answer
// Unimplemented, which a real node never does (so a test that hits one fails loudly).
type machineServer struct {
	machine.UnimplementedMachineServiceServer

	node *simNode
}

// Version answers like machined (talos@v1.12.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:1178-1206):
// one message without metadata (apid's backend appends the node's), platform, RBAC enabled once configured.
// The build fields (SHA, Go version) are the nodes file's: simnode has no source for a release's values.
func (s *machineServer) Version(context.Context, *emptypb.Empty) (*machine.VersionResponse, error) {
	return &machine.VersionResponse{
		Messages: []*machine.Version{{
			Version: &machine.VersionInfo{
				Tag:       s.node.bootState().version,
				Sha:       s.node.spec.SHA,
				GoVersion: s.node.spec.GoVersion,
				Os:        "linux",
				Arch:      "amd64",
			},
			Platform: &machine.PlatformInfo{Name: "metal", Mode: "metal"},
			Features: &machine.FeaturesInfo{Rbac: true},
		}},
	}, nil
}

// ServiceList answers like machined (same file, :707-719) with ServiceRunner.AsProto's fields
// (talos@v1.12.0:internal/app/machined/pkg/system/service_runner.go:377-387), sorted by ID (byID).
func (s *machineServer) ServiceList(context.Context, *emptypb.Empty) (*machine.ServiceListResponse, error) {
	current := byID(s.node.currentServices())
	services := make([]*machine.ServiceInfo, 0, len(current))

	for _, svc := range current {
		services = append(services, serviceInfo(svc))
	}

	return &machine.ServiceListResponse{Messages: []*machine.ServiceList{{Services: services}}}, nil
}

func serviceInfo(svc ServiceSpec) *machine.ServiceInfo {
	events := make([]*machine.ServiceEvent, 0, len(svc.Events))
	for _, ev := range svc.Events {
		events = append(events, &machine.ServiceEvent{Msg: ev.Msg, State: ev.State, Ts: timestamppb.New(ev.Ts)})
	}

	health := &machine.ServiceHealth{Unknown: svc.Healthy == nil, LastMessage: svc.LastMessage}
	if svc.Healthy != nil {
		health.Healthy = *svc.Healthy
	}

	return &machine.ServiceInfo{
		Id:     svc.ID,
		State:  svc.State,
		Events: &machine.ServiceEvents{Events: events},
		Health: health,
	}
}

// readChunk is the default chunk size of the stream.Chunker machined reads files with
// (talos@v1.12.0:pkg/chunker/stream/stream.go:51).
const readChunk = 1024

// bootIDPath is the kernel's boot ID, new on every boot: what talosctl's tracker compares before and after an
// upgrade or reboot (talos@v1.12.0:cmd/talosctl/pkg/talos/action/tracker.go getBootID, BootIDChangedPostCheckFn).
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// Read streams a file of the nodes file's "files" (talos@v1.12.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:1351-1387):
// a missing path is os.Stat's error, NotFound from 1.8 (missingFile).
func (s *machineServer) Read(in *machine.ReadRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	content, ok := s.node.file(in.GetPath())

	switch in.GetPath() {
	case bootIDPath:
		content, ok = s.node.bootState().bootID+"\n", true
	case cmdlinePath:
		content, ok = s.node.cmdline(), true
	}

	if !ok {
		return missingFile(s.node.bootState().version, in.GetPath())
	}

	data := []byte(content)
	for start := 0; start < len(data); start += readChunk {
		if err := srv.Send(&common.Data{Bytes: data[start:min(start+readChunk, len(data))]}); err != nil {
			return err
		}
	}

	return nil
}
