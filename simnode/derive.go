package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/resources/v1alpha1"
)

// A node with "image" is not described, it is derived: what its installer image bakes in and what its machine
// config asks for decide which extensions it lists, which NVIDIA modules are Live and how the extension
// services run. These are the facts the derivation follows (the real sources, at the tags cited):
//
//   - The kmod extensions (nvidia-open-gpu-kernel-modules-*, nonfree-kmod-nvidia-*) blacklist all four NVIDIA
//     modules (extensions@v1.12.0:nvidia-gpu/nvidia-modules/lts/files/nvidia.conf and
//     nvidia-gpu/nonfree/kmod-nvidia/lts/files/nvidia.conf), so a module is loaded only when the extension is
//     installed and machine.kernel.modules names it (KernelModuleSpecController,
//     talos@v1.12.0:internal/app/machined/pkg/controllers/runtime/kernel_module_spec.go). A module not in the
//     list is not loaded even as a dependency (ours: simnode does not model modprobe's dependency loading).
//   - The toolkit extension (nvidia-container-toolkit-*) runs ext-nvidia-persistenced, which depends on the
//     path /sys/bus/pci/drivers/nvidia (extensions@v1.12.0:nvidia-gpu/nvidia-container-toolkit/lts/nvidia-persistenced.yaml):
//     Running when the nvidia driver is registered, else Waiting with the service runner's message
//     (talos@v1.12.0:internal/app/machined/pkg/system/service_runner.go:158, pkg/conditions/files.go:43).
//   - From extensions v1.13.0 (Talos 1.13) it also runs ext-nvidia-cdi-gen, a one-shot (restart: untilSuccess)
//     that depends on ext-nvidia-persistenced (extensions@v1.13.0:nvidia-gpu/nvidia-container-toolkit/lts/nvidia-cdi-gen.yaml):
//     Finished once persistenced is up. A Finished service has no Service resource (see createServices).
var nvidiaModules = []string{"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"}

const (
	persistenced   = "ext-nvidia-persistenced"
	cdiGen         = "ext-nvidia-cdi-gen"
	nvidiaDriverFS = "/sys/bus/pci/drivers/nvidia"
)

func isKmodExtension(name string) bool {
	return strings.HasPrefix(name, "nvidia-open-gpu-kernel-modules") || strings.HasPrefix(name, "nonfree-kmod-nvidia")
}

func isToolkitExtension(name string) bool { return strings.HasPrefix(name, "nvidia-container-toolkit") }

// derived is a node's state as its image and config make it.
type derived struct {
	extensions []ExtensionSpec
	modules    []ModuleSpec
	services   []ServiceSpec // the nodes file's base services, then the extension services
	files      map[string]string
}

// driverBound: the nvidia module is Live, so its PCI driver directory exists.
func (d derived) driverBound() bool {
	return slices.ContainsFunc(d.modules, func(m ModuleSpec) bool { return m.Name == "nvidia" })
}

// waiting names the services a boot's startAllServices would still wait for (not up: neither Running nor
// Finished), in the form of the condition's description (talos@v1.12.0:internal/app/machined/pkg/system/service_events.go:103).
func (d derived) waiting() []string {
	var out []string

	for _, svc := range d.services {
		if svc.State != "Running" && svc.State != "Finished" {
			out = append(out, fmt.Sprintf("service %q to be %q", svc.ID, "up"))
		}
	}

	return out
}

func deriveState(img ImageSpec, cfg config.Provider, base []ServiceSpec, now time.Time) derived {
	var p pids

	d := derived{extensions: img.Extensions, services: bootServices(base, now, &p)}

	if i := slices.IndexFunc(img.Extensions, func(e ExtensionSpec) bool { return isKmodExtension(e.Name) }); i >= 0 {
		wanted := configModules(cfg)
		for _, m := range nvidiaModules {
			if slices.Contains(wanted, m) {
				d.modules = append(d.modules, ModuleSpec{Name: m, State: "Live", Address: "0xffffffffc0000000"})
			}
		}

		// what /proc/modules' refcount and users columns say, which the LoadedKernelModule resource carries too
		// (talos@v1.12.0 internal/app/machined/pkg/controllers/runtime/loaded_kernel_module.go ParseModules)
		for i := range d.modules {
			d.modules[i].Dependencies = moduleUsers(d.modules[i].Name, d.modules)
			d.modules[i].ReferenceCount = len(d.modules[i].Dependencies)
		}

		d.files = map[string]string{procModules: procModulesText(d.modules, moduleTaints(img.Extensions[i]), atLeast(img.TalosVersion, 1, 9))}
		if d.driverBound() {
			d.files[driverVersionFile] = driverVersion(img.Extensions[i])
		}
	} else {
		d.files = map[string]string{procModules: ""}
	}

	if slices.ContainsFunc(img.Extensions, func(e ExtensionSpec) bool { return isToolkitExtension(e.Name) }) {
		d.services = append(d.services, toolkitServices(d.driverBound(), atLeast(img.TalosVersion, 1, 13), now, &p)...)
	}

	return d
}

// procModules is the kernel's list of loaded modules: what the runbook's verify reads on Talos < 1.11, which has
// no LoadedKernelModule resource (talos@v1.10.0:internal/app/machined/pkg/runtime/v1alpha2/v1alpha2_state.go
// registers none; v1.11.0 added it, :218). simnode lists only the modules it models (the NVIDIA ones): a real
// node lists the other loadable modules too.
const procModules = "/proc/modules"

// procModulesText is /proc/modules for mods (in load order), one line each as the kernel's m_show prints it
// (linux kernel/module/procfs.c m_show, read from excerpts, no tag checked: name, size, print_unload_info's
// refcount and dependencies, state, address, then the taint flags in parentheses when the module taints the
// kernel), the newest module first (kernel/module/main.c add_unformed_module prepends each module it loads with
// list_add_rcu, no tag checked).
//
// refcount and dependencies: a kernel without CONFIG_MODULE_UNLOAD prints "- -", as the Talos docs' sample
// (`nvidia_uvm 1146880 - - Live 0xffffffffc2733000 (PO)`, ../shared/docs/talos-nvidia.md) does; Talos's kernels
// had it unset up to 1.8 and set from 1.9 (siderolabs/pkgs@v1.8.0 kernel/build/config-amd64:889 "# CONFIG_MODULE_UNLOAD
// is not set", @v1.9.0 :936 "CONFIG_MODULE_UNLOAD=y"), which prints the refcount and the modules using this one,
// each followed by a comma, or "-" (Talos's own parser reads them so, talos@v1.14.1
// internal/app/machined/pkg/controllers/runtime/kernel_module_status.go:320, testdata/kernel-modules/proc-modules.txt:
// `curve25519_x86_64 36864 1 wireguard, Live 0x0000000000000000`). The refcount counts only the modelled NVIDIA
// modules that use a module: on a real node open device files add to it (no capture from a Talos node found).
func procModulesText(mods []ModuleSpec, taints string, unload bool) string {
	var b strings.Builder

	for _, m := range slices.Backward(mods) {
		fmt.Fprintf(&b, "%s %d %s %s %s", m.Name, m.Size, unloadInfo(m, unload), m.State, m.Address)

		if taints != "" {
			fmt.Fprintf(&b, " (%s)", taints)
		}

		b.WriteString("\n")
	}

	return b.String()
}

// nvidiaUsers are the NVIDIA modules that use each one (nvidia-drm uses nvidia-modeset; nvidia-uvm and
// nvidia-modeset use nvidia: NVIDIA/open-gpu-kernel-modules kernel-open/nvidia-drm, nvidia-modeset and
// nvidia-uvm call into the module below them; no tag checked).
var nvidiaUsers = map[string][]string{
	"nvidia":         {"nvidia_uvm", "nvidia_modeset"},
	"nvidia_modeset": {"nvidia_drm"},
}

// moduleUsers are the loaded modules that use name, in nvidiaUsers' order: the kernel lists the newest user
// first (it prepends each use to the module's source_list, no tag checked), and the modules' real load order is
// not modelled (simnode/README.md).
func moduleUsers(name string, mods []ModuleSpec) []string {
	var users []string

	for _, user := range nvidiaUsers[name] {
		if slices.ContainsFunc(mods, func(m ModuleSpec) bool { return m.Name == user }) {
			users = append(users, user)
		}
	}

	return users
}

// unloadInfo is print_unload_info's "refcount users" of a module, each user followed by a comma, "-" for
// none; "- -" without CONFIG_MODULE_UNLOAD (procModulesText).
func unloadInfo(m ModuleSpec, unload bool) string {
	if !unload {
		return "- -"
	}

	if len(m.Dependencies) == 0 {
		return fmt.Sprintf("%d -", m.ReferenceCount)
	}

	return fmt.Sprintf("%d %s,", m.ReferenceCount, strings.Join(m.Dependencies, ","))
}

// moduleTaints are the taint flags of the kmod extension's modules: out-of-tree (O), and proprietary (P) for
// nonfree-kmod-nvidia (kernel/panic.c taint_flags; as the Python simulator prints them, runbook_lib/sim/
// talosctl/main.py; no capture from a Talos node at hand, so whether they are also unsigned, E, is not known).
func moduleTaints(kmod ExtensionSpec) string {
	if strings.HasPrefix(kmod.Name, "nonfree-kmod-nvidia") {
		return "PO"
	}

	return "O"
}

// driverVersionFile is what the loaded nvidia module reports; the runbook's verify reads it.
const driverVersionFile = "/proc/driver/nvidia/version"

// driverVersion is the file's text for the kmod extension's driver (the version before "-": 570.172.08-v1.12.0).
// The wording is the open and the proprietary module's first line (as runbook_lib/sim/talosctl/main.py has them,
// from captures cited there); the build host and date are not the release's (no source for them).
func driverVersion(kmod ExtensionSpec) string {
	drv, _, _ := strings.Cut(kmod.Version, "-")
	if strings.HasPrefix(kmod.Name, "nvidia-open-gpu-kernel-modules") {
		return "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  " + drv +
			"  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Thu Oct 30 06:09:39 UTC 2025\nGCC version:  gcc version 14.2.0 (GCC) \n"
	}

	return "NVRM version: NVIDIA UNIX x86_64 Kernel Module  " + drv + "  Thu Oct 30 06:09:39 UTC 2025\nGCC version:  gcc version 14.2.0 (GCC) \n"
}

func toolkitServices(bound, withCDIGen bool, now time.Time, p *pids) []ServiceSpec {
	pers := ServiceSpec{ID: persistenced, State: "Waiting", LastMessage: ""}
	pers.Events = []EventSpec{{Msg: fmt.Sprintf("Waiting for file %q to exist", nvidiaDriverFS), State: "Waiting", Ts: now}}

	if bound { // runner/containerd/containerd.go:224 (the PID is ours: services.go pids)
		pers.State = "Running"
		pers.Events = append(pers.Events, EventSpec{Msg: startedTask(persistenced, p.take()), State: "Running", Ts: now})
	}

	out := []ServiceSpec{pers}
	if !withCDIGen {
		return out
	}

	gen := ServiceSpec{ID: cdiGen, State: "Waiting", Events: []EventSpec{
		{Msg: fmt.Sprintf("Waiting for service %q to be %q", persistenced, "up"), State: "Waiting", Ts: now},
	}}

	if bound { // system/system.go:191
		gen.State = "Finished"
		gen.Events = append(gen.Events, EventSpec{Msg: "Service finished successfully", State: "Finished", Ts: now})
	}

	return append(out, gen)
}

// configModules are the modules the config loads: machine.kernel.modules and, from Talos 1.14, the
// KernelModuleConfig documents, which the container merges (talos@v1.14.1:pkg/machinery/config/container/
// container.go:360-372, KernelModuleConfigs: v1alpha1's first, the documents after).
func configModules(cfg config.Provider) []string {
	if cfg == nil {
		return nil
	}

	var out []string
	for _, m := range cfg.KernelModuleConfigs() {
		out = append(out, m.Name())
	}

	return out
}

// atLeast compares a Talos tag (v1.13.0, v1.13.0-beta.1) with major.minor.
func atLeast(tag string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(strings.TrimPrefix(tag, "v"), "%d.%d", &ma, &mi); err != nil {
		return false
	}

	return ma > major || (ma == major && mi >= minor)
}

// writeDerived replaces the node's ExtensionStatus, LoadedKernelModule (KernelModuleStatus from 1.14) and Service
// resources with d's, for a node running release tag.
func writeDerived(ctx context.Context, st state.State, d derived, tag string) error {
	for _, kind := range []resource.Metadata{
		resource.NewMetadata(runtime.NamespaceName, runtime.ExtensionStatusType, "", resource.VersionUndefined),
		resource.NewMetadata(runtime.NamespaceName, runtime.LoadedKernelModuleType, "", resource.VersionUndefined), //nolint:staticcheck
		resource.NewMetadata(runtime.NamespaceName, runtime.KernelModuleStatusType, "", resource.VersionUndefined),
		resource.NewMetadata(v1alpha1.NamespaceName, v1alpha1.ServiceType, "", resource.VersionUndefined),
	} {
		if err := destroyAll(ctx, st, kind); err != nil {
			return err
		}
	}

	spec := &NodeSpec{TalosVersion: tag, Extensions: d.extensions, KernelModules: d.modules, Services: d.services}

	for _, step := range []func(context.Context, state.State, *NodeSpec) error{createExtensions, createModules, createServices} {
		if err := step(ctx, st, spec); err != nil {
			return err
		}
	}

	return nil
}

// writeModuleSpecs replaces the KernelModuleSpec resources with one per machine.kernel.modules entry, as
// KernelModuleConfigController writes them (talos@v1.10.0 and v1.12.0:internal/app/machined/pkg/controllers/
// runtime/kernel_module_config.go: ID and name the module's, its parameters; v1.14.1 reads KernelModuleConfigs,
// the v1alpha1 entries and the KernelModuleConfig documents).
func writeModuleSpecs(ctx context.Context, st state.State, cfg config.Provider) error {
	kind := resource.NewMetadata(runtime.NamespaceName, runtime.KernelModuleSpecType, "", resource.VersionUndefined)
	if err := destroyAll(ctx, st, kind); err != nil {
		return err
	}

	if cfg == nil {
		return nil
	}

	for _, m := range cfg.KernelModuleConfigs() {
		res := runtime.NewKernelModuleSpec(runtime.NamespaceName, m.Name())
		*res.TypedSpec() = runtime.KernelModuleSpecSpec{Name: m.Name(), Parameters: m.Parameters()}

		if err := st.Create(ctx, res, state.WithCreateOwner("runtime.KernelModuleConfigController")); err != nil {
			return fmt.Errorf("kernel module spec %q: %w", m.Name(), err)
		}
	}

	return nil
}

func destroyAll(ctx context.Context, st state.State, kind resource.Metadata) error {
	list, err := st.List(ctx, kind)
	if err != nil {
		return err
	}

	for _, res := range list.Items {
		if err = st.Destroy(ctx, res.Metadata(), state.WithDestroyOwner(res.Metadata().Owner())); err != nil {
			return fmt.Errorf("%s: %w", res.Metadata(), err)
		}
	}

	return nil
}
