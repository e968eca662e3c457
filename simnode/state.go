package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/registry"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/resources/v1alpha1"
)

// Talos namespaces the resources below live in, with Talos's descriptions
// (talos@v1.12.0:internal/app/machined/pkg/runtime/v1alpha2/v1alpha2_state.go:72-96, a subset).
var talosNamespaces = []struct{ name, description string }{
	{v1alpha1.NamespaceName, "Talos v1alpha1 subsystems glue resources."},
	{config.NamespaceName, "Talos node configuration."},
	{hardware.NamespaceName, "Hardware resources."},
	{k8s.NamespaceName, "Kubernetes all node types resources."},
}

// Resource types a node registers (releaseResources adjusts them before 1.11): a subset of the ones Talos registers (same file, :98-250), so
// their ResourceDefinitions (aliases, print columns) are the machinery's own. A type missing here answers
// `resource "<type>" is not registered`, as it would on a Talos release without it.
var talosResources = []meta.ResourceWithRD{
	&config.MachineConfig{},
	&hardware.PCIDevice{},
	&k8s.Nodename{},
	&runtime.ExtensionStatus{},
	&runtime.KernelModuleSpec{},
	&runtime.KernelModuleStatus{},
	&runtime.LoadedKernelModule{},
	&runtime.PlatformMetadata{},
	&v1alpha1.Service{},
}

// newNodeState builds one node's COSI state the way machined does (same file, :46-70): namespaced in-memory
// states, the default COSI namespaces and resource definitions, then Talos's.
func newNodeState(ctx context.Context, tag string) (state.State, error) {
	st := state.WrapCore(namespaced.NewState(inmem.Build))

	nsReg := registry.NewNamespaceRegistry(st)
	resReg := registry.NewResourceRegistry(st)

	if err := nsReg.RegisterDefault(ctx); err != nil {
		return nil, err
	}

	if err := resReg.RegisterDefault(ctx); err != nil {
		return nil, err
	}

	for _, ns := range talosNamespaces {
		if err := nsReg.Register(ctx, ns.name, ns.description); err != nil {
			return nil, err
		}
	}

	for _, r := range releaseResources(tag) {
		if err := resReg.Register(ctx, r); err != nil {
			return nil, err
		}
	}

	return st, nil
}

// populate writes the node's resources from its spec.
func populate(ctx context.Context, st state.State, n *NodeSpec) error {
	for _, step := range []func(context.Context, state.State, *NodeSpec) error{
		createExtensions, createModules, createServices, createMachineConfig, createPlatformMetadata, createPCIDevices, createNodename,
	} {
		if err := step(ctx, st, n); err != nil {
			return fmt.Errorf("node %s (%s): %w", n.Name, n.Address, err)
		}
	}

	return nil
}

// Each resource is created with the owner Talos's controller gives it (its Name(): talos@v1.12.0:
// internal/app/machined/pkg/controllers/runtime/extension_status.go:28, loaded_kernel_module.go:33,
// v1alpha1/service.go:28); MachineConfig has none (set outside controllers, v1alpha2_state.go:297).

// createExtensions: one ExtensionStatus per layer, ID = image name without ".sqsh", the layer's index when
// the spec has no image (talos@v1.12.0:internal/app/machined/pkg/controllers/runtime/extension_status.go:66-75).
func createExtensions(ctx context.Context, st state.State, n *NodeSpec) error {
	for i, ext := range n.Extensions {
		id := strings.TrimSuffix(ext.Image, ".sqsh")
		if id == "" {
			id = strconv.Itoa(i)
		}

		res := runtime.NewExtensionStatus(runtime.NamespaceName, id)
		*res.TypedSpec() = runtime.ExtensionStatusSpec{
			Image: ext.Image,
			Metadata: extensions.Metadata{
				Name:          ext.Name,
				Version:       ext.Version,
				Author:        ext.Author,
				Description:   ext.Description,
				Compatibility: extensions.Compatibility{Talos: extensions.Constraint{Version: ext.Compatibility}},
			},
		}

		if err := st.Create(ctx, res, state.WithCreateOwner("runtime.ExtensionStatusController")); err != nil {
			return fmt.Errorf("extension %q: %w", ext.Name, err)
		}
	}

	return nil
}

func createModules(ctx context.Context, st state.State, n *NodeSpec) error {
	for _, mod := range n.KernelModules {
		// Deprecated in 1.14's machinery, and still written by 1.14's machined (moduleOwner).
		res := runtime.NewLoadedKernelModule(runtime.NamespaceName, mod.Name) //nolint:staticcheck
		*res.TypedSpec() = runtime.LoadedKernelModuleSpec{                    //nolint:staticcheck
			Size:           mod.Size,
			ReferenceCount: mod.ReferenceCount,
			Dependencies:   mod.Dependencies,
			State:          mod.State,
			Address:        mod.Address,
		}

		if err := st.Create(ctx, res, state.WithCreateOwner(moduleOwner(n.TalosVersion))); err != nil {
			return fmt.Errorf("kernel module %q: %w", mod.Name, err)
		}

		if err := createModuleStatus(ctx, st, n.TalosVersion, mod); err != nil {
			return err
		}
	}

	return nil
}

// moduleOwner: Talos 1.14 writes the deprecated LoadedKernelModule from KernelModuleStatusController
// (talos@v1.14.1:internal/app/machined/pkg/controllers/runtime/kernel_module_status.go:45-46,194-207); up to
// 1.13 LoadedKernelModuleController writes it (talos@v1.12.0 .../runtime/loaded_kernel_module.go:33).
func moduleOwner(tag string) string {
	if atLeast(tag, 1, 14) {
		return "runtime.KernelModuleStatusController"
	}

	return "runtime.LoadedKernelModuleController"
}

// createModuleStatus: from 1.14, each loaded module is also a KernelModuleStatus of type dynamic with its
// /proc/modules state parsed (Live -> live), the resource `talosctl get modules` lists there (same file,
// :209-227). Built-in modules (type and state built-in, :160-175) are not simulated: simnode has no
// modules.builtin list.
func createModuleStatus(ctx context.Context, st state.State, tag string, mod ModuleSpec) error {
	if !atLeast(tag, 1, 14) {
		return nil
	}

	moduleState, err := runtime.ParseDynamicModuleState(mod.State)
	if err != nil {
		return fmt.Errorf("kernel module %q: %w", mod.Name, err)
	}

	res := runtime.NewKernelModuleStatus(runtime.NamespaceName, mod.Name)
	*res.TypedSpec() = runtime.KernelModuleStatusSpec{
		Type:           runtime.KernelModuleTypeDynamic,
		Size:           mod.Size,
		ReferenceCount: mod.ReferenceCount,
		Dependencies:   mod.Dependencies,
		State:          moduleState,
		Address:        mod.Address,
	}

	if err := st.Create(ctx, res, state.WithCreateOwner(moduleOwner(tag))); err != nil {
		return fmt.Errorf("kernel module status %q: %w", mod.Name, err)
	}

	return nil
}

// createServices: a Service resource exists only while the service runs; any other state destroys it
// (talos@v1.12.0:internal/app/machined/pkg/controllers/v1alpha1/service.go:73-91).
func createServices(ctx context.Context, st state.State, n *NodeSpec) error {
	for _, svc := range n.Services {
		if svc.State != "Running" {
			continue
		}

		res := v1alpha1.NewService(svc.ID)
		*res.TypedSpec() = v1alpha1.ServiceSpec{Running: true, Healthy: svc.Healthy != nil && *svc.Healthy, Unknown: svc.Healthy == nil}

		if err := st.Create(ctx, res, state.WithCreateOwner("v1alpha1.ServiceController")); err != nil {
			return fmt.Errorf("service %q: %w", svc.ID, err)
		}
	}

	return nil
}

// createMachineConfig decodes the config with Talos's own loader (strict: unknown keys are an error,
// talos@v1.12.0:pkg/machinery/config/configloader/internal/decoder/decoder.go), as machined does on boot.
func createMachineConfig(ctx context.Context, st state.State, n *NodeSpec) error {
	if n.MachineConfig == "" {
		return nil
	}

	provider, err := configloader.NewFromBytes([]byte(n.MachineConfig))
	if err != nil {
		return fmt.Errorf("\"machine_config\": %w", err)
	}

	return st.Create(ctx, config.NewMachineConfig(provider))
}

// createPlatformMetadata: the single "platformmetadata" resource, owned by the controller that writes it
// (talos@v1.12.0:internal/app/machined/pkg/controllers/network/platform_config_apply.go:33,399-408; before
// 1.12 PlatformConfigController, talos@v1.9.0 to v1.11.0 .../network/platform_config.go Name and :112,518 at
// v1.11.0).
func createPlatformMetadata(ctx context.Context, st state.State, n *NodeSpec) error {
	if n.PlatformMetadata == nil {
		return nil
	}

	res := runtime.NewPlatformMetadataSpec(runtime.NamespaceName, runtime.PlatformMetadataID)
	*res.TypedSpec() = *n.PlatformMetadata

	owner := "network.PlatformConfigApplyController"
	if !atLeast(n.TalosVersion, 1, 12) {
		owner = "network.PlatformConfigController"
	}

	return st.Create(ctx, res, state.WithCreateOwner(owner))
}

// createPCIDevices: one PCIDevice per device, ID = PCI address
// (talos@v1.12.0:internal/app/machined/pkg/controllers/hardware/pcidevices.go:36,142-147).
func createPCIDevices(ctx context.Context, st state.State, n *NodeSpec) error {
	if !hasPCIDevices(n.TalosVersion) {
		return nil
	}

	for _, dev := range n.PCIDevices {
		res := hardware.NewPCIDeviceInfo(dev.ID)
		*res.TypedSpec() = hardware.PCIDeviceSpec{
			Class: dev.Class, Subclass: dev.Subclass, Vendor: dev.Vendor, Product: dev.Product,
			ClassID: dev.ClassID, SubclassID: dev.SubclassID, VendorID: dev.VendorID, ProductID: dev.ProductID,
			Driver: dev.Driver,
		}

		if err := st.Create(ctx, res, state.WithCreateOwner("hardware.PCIDevicesController")); err != nil {
			return fmt.Errorf("PCI device %q: %w", dev.ID, err)
		}
	}

	return nil
}
