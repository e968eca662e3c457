package main

import (
	"context"

	cosiapi "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"go.yaml.in/yaml/v4"
	"google.golang.org/grpc"
)

// Talos 1.9, 1.10 and 1.11 nodes: simnode is built on pkg/machinery v1.13.0, so where those releases' machined
// answers differently in a way the runbook meets, the difference is made here, per node release (each cited).
// What was checked and found the same for 1.9 to 1.12: the dry-run summary and its diff
// (generateDiff/configdiff.DiffToString, talos@v1.9.0, v1.10.0 and v1.11.0:internal/app/machined/internal/server/
// v1alpha1/v1alpha1_server.go, identical to v1.12.0's: configDiff's diff112, except 1.9's hunk header, see
// diff112), CanApplyImmediate
// (internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go, same fields), PlatformMetadata and PCIDevice
// (registered in v1alpha2_state.go in 1.9 already), and the legacy MachineService.Upgrade (no LifecycleService
// before 1.13, lifecycle113.go).

// yamlSpecAPI is the first release whose MachineConfig spec is a YAML string with the "talos.dev/yaml-spec"
// annotation: talos commit 92eeaa482 ("fix: update YAML library", first in v1.12.0) replaced the spec's
// MarshalYAMLBytes (the config document itself: talos@v1.11.0:pkg/machinery/resources/config/machine_config.go:43-46,
// the same in v1.9.0 and v1.10.0) with MarshalYAML returning the config as a string, and added the annotation so a newer
// talosctl can tell the two apart (v1.12.0 machine_config.go:43-72, cmd/talosctl/cmd/talos/patch.go
// extractMachineConfigBody). talosctl 1.9-1.11 marshal the spec and patch it as a document
// (talos@v1.11.0:cmd/talosctl/cmd/talos/patch.go:53-58): given the string, their decoder fails with
// "recovered: expected a mapping node".
const yamlSpecAnnotation = "talos.dev/yaml-spec"

// stateServer is the COSI State service of a boot running tag: before 1.12 it sends MachineConfig as those
// releases did.
func stateServer(st state.State, tag string) cosiapi.StateServer {
	srv := server.NewState(st)
	if atLeast(tag, 1, 12) {
		return srv
	}

	return legacyState{srv}
}

// legacyState rewrites each MachineConfig resource it sends (Get, List, Watch) to the pre-1.12 encoding.
type legacyState struct{ cosiapi.StateServer }

func (s legacyState) Get(ctx context.Context, in *cosiapi.GetRequest) (*cosiapi.GetResponse, error) {
	resp, err := s.StateServer.Get(ctx, in)
	if err == nil {
		err = legacyMachineConfig(resp.GetResource())
	}

	return resp, err
}

func (s legacyState) List(in *cosiapi.ListRequest, srv grpc.ServerStreamingServer[cosiapi.ListResponse]) error {
	return s.StateServer.List(in, legacyStream[cosiapi.ListResponse]{srv, func(r *cosiapi.ListResponse) error {
		return legacyMachineConfig(r.GetResource())
	}})
}

func (s legacyState) Watch(in *cosiapi.WatchRequest, srv grpc.ServerStreamingServer[cosiapi.WatchResponse]) error {
	return s.StateServer.Watch(in, legacyStream[cosiapi.WatchResponse]{srv, func(r *cosiapi.WatchResponse) error {
		for _, ev := range r.GetEvent() {
			for _, res := range []*cosiapi.Resource{ev.GetResource(), ev.GetOld()} {
				if err := legacyMachineConfig(res); err != nil {
					return err
				}
			}
		}

		return nil
	}})
}

// legacyStream rewrites each message before it is sent.
type legacyStream[T any] struct {
	grpc.ServerStreamingServer[T]

	rewrite func(*T) error
}

func (s legacyStream[T]) Send(msg *T) error {
	if err := s.rewrite(msg); err != nil {
		return err
	}

	return s.ServerStreamingServer.Send(msg)
}

// legacyMachineConfig turns a MachineConfig resource's YAML spec from 1.12's string back into the document
// (the same config bytes: both encodings marshal cfg.Bytes()) and drops the annotation 1.12 added. The proto
// spec is unchanged (configpb.MachineConfigSpec, YamlMarshalled, in both).
func legacyMachineConfig(res *cosiapi.Resource) error {
	if res == nil || res.GetMetadata().GetType() != string(configres.MachineConfigType) || res.GetSpec() == nil {
		return nil
	}

	var body string
	if err := yaml.Unmarshal([]byte(res.GetSpec().GetYamlSpec()), &body); err != nil {
		return err
	}

	res.Spec.YamlSpec = body
	delete(res.Metadata.Annotations, yamlSpecAnnotation)

	return nil
}

// releaseResources are the resource types a node of release tag registers (state.go's talosResources, on
// pkg/machinery v1.14.1). Talos 1.9 and 1.10 have no LoadedKernelModule, and their KernelModuleSpec (the modules the
// config asks for) carries the alias "modules" (talos@v1.10.0:pkg/machinery/resources/runtime/kernel_module_spec.go:
// 43-49, v1alpha2_state.go registers no LoadedKernelModule; the same in v1.9.0): `talosctl get modules` lists the
// config's modules there, not the loaded ones, which is why the runbook reads /proc/modules before 1.11. 1.11 added
// LoadedKernelModule with the aliases "module", "modules" and dropped KernelModuleSpec's (talos@v1.11.0, same
// files, and v1alpha2_state.go:218). 1.14 added KernelModuleStatus and moved the aliases to it
// (talos@v1.14.1:pkg/machinery/resources/runtime/kernel_module_status.go:50-68; loaded_kernel_module.go has none),
// so before 1.14 there is no KernelModuleStatus and LoadedKernelModule keeps them (talos@v1.13.0, same file:48).
// The types are registered once, for the release the node starts on: an upgrade from 1.9/1.10 to 1.11+ keeps
// them (ours; the runbook upgrades within a release).
func releaseResources(tag string) []meta.ResourceWithRD {
	if atLeast(tag, 1, 14) {
		return talosResources
	}

	out := make([]meta.ResourceWithRD, 0, len(talosResources))

	for _, r := range talosResources {
		switch r.(type) {
		case *runtime.KernelModuleStatus:
			continue
		case *hardware.PCIDevice:
			if !hasPCIDevices(tag) {
				continue
			}
		case *runtime.LoadedKernelModule: //nolint:staticcheck
			if !atLeast(tag, 1, 11) {
				continue
			}

			rd := r.ResourceDefinition()
			rd.Aliases = []resource.Type{"module", "modules"}
			r = withDefinition{r, rd}
		case *runtime.KernelModuleSpec:
			if !atLeast(tag, 1, 11) {
				rd := r.ResourceDefinition()
				rd.Aliases = []resource.Type{"modules"}
				r = withDefinition{r, rd}
			}
		}

		out = append(out, r)
	}

	return out
}

// withDefinition registers a machinery type under another release's ResourceDefinition.
type withDefinition struct {
	meta.ResourceWithRD

	rd meta.ResourceDefinitionSpec
}

func (w withDefinition) ResourceDefinition() meta.ResourceDefinitionSpec { return w.rd }
