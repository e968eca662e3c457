package main

import (
	"fmt"
	"slices"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
)

// Per-node faults of the nodes file: the fault scenarios of `runbook sim scenarios` (runbook_lib/sim/scenarios.py)
// on a derived node. Each one stays with the node whatever image it boots, as the Python simulator's faults do.

// ExtensionFault replaces (or, without "replace", drops) the extension Name in every image the node boots:
// a node whose kmod and toolkit come from different tracks, or that lacks the toolkit. Ours: no Talos mechanism
// changes a schematic's extensions per node; it keeps the Python simulator's driver_mismatch and toolkit_missing
// faults (runbook_lib/sim/talosctl/images.py apply_extension_faults) on the node across upgrades.
type ExtensionFault struct {
	Name    string         `json:"name"`
	Replace *ExtensionSpec `json:"replace,omitempty"`
}

// withFaults is img as the node lists it: its extension faults applied.
func (s *NodeSpec) withFaults(img ImageSpec) ImageSpec {
	if len(s.ExtensionFaults) == 0 {
		return img
	}

	out := ImageSpec{TalosVersion: img.TalosVersion}

	for _, ext := range img.Extensions {
		i := slices.IndexFunc(s.ExtensionFaults, func(f ExtensionFault) bool { return f.Name == ext.Name })
		switch {
		case i < 0:
			out.Extensions = append(out.Extensions, ext)
		case s.ExtensionFaults[i].Replace != nil:
			out.Extensions = append(out.Extensions, *s.ExtensionFaults[i].Replace)
		}
	}

	return out
}

// moduleConfig is the config the NVIDIA modules load from. With nvidia_probe_fails the GPU is one the driver
// cannot initialise (unsupported by the branch, or fallen off the bus): nvidia.ko's init returns -ENODEV when no
// device probed ("NVRM: None of the NVIDIA devices were initialized.", NVIDIA/open-gpu-kernel-modules
// kernel-open/nvidia/nv.c; no tag checked), so modprobe fails, nothing that depends on nvidia loads, the driver
// directory never appears and ext-nvidia-persistenced waits: the node derives as if no module were configured.
// A node whose pci_devices list no NVIDIA display controller is the same case with no device at all (nv.c:
// "NVRM: No NVIDIA GPU found.", -ENODEV; no tag checked): the NVIDIA extensions on a CPU-only node hang its
// boot in startAllServices on ext-nvidia-persistenced (siderolabs/extensions#888).
func (s *NodeSpec) moduleConfig(cfg config.Provider) config.Provider {
	if s.NvidiaProbeFails || (len(s.PCIDevices) > 0 && !slices.ContainsFunc(s.PCIDevices, isNvidiaGPU)) {
		return nil
	}

	return cfg
}

// isNvidiaGPU: vendor NVIDIA (0x10de), class display controller (0x03).
func isNvidiaGPU(d PCIDeviceSpec) bool { return d.VendorID == "0x10de" && d.ClassID == "0x03" }

func validateFaults(n *NodeSpec, label string) error {
	for i, f := range n.ExtensionFaults {
		if f.Name == "" || (f.Replace != nil && f.Replace.Name == "") {
			return fmt.Errorf("%s: \"extension_faults\"[%d]: \"name\" (and a \"replace\"'s name) must not be empty", label, i)
		}
	}

	return nil
}

// failInstall is an upgrade whose installer run fails with reason: fail_install's non-zero exit (ours, no source
// for why it would; RunInstallerContainer's "task %q failed: exit code 1", talos@v1.12.0:internal/pkg/install/
// install.go:261) or an image of machine.install.extensions that does not pull (installext.go). The upgrade
// sequence's phases of the running release run up to its "upgrade" task, which fails, so Controller.Run publishes
// the sequence error (v1alpha1_controller.go:139-157, the wrapping of :275-317) and the server only logs it
// (v1alpha1_server.go:558-562): no reboot, the node keeps running the image it had. Not modelled: the services
// the sequence stopped before the install stay stopped on a real node.
func (n *simNode) failInstall(actorID string, preserve bool, reason string) {
	phases := upgradePhasesOf(n.bootState().version, preserve, n.controlPlane())
	install := slices.IndexFunc(phases, func(pt [2]string) bool { return pt[1] == "upgrade" })
	bus := n.bus()
	bus.publish(actorID, &machine.SequenceEvent{Sequence: "upgrade", Action: machine.SequenceEvent_START})
	n.runPhases(bus, actorID, phases[:install+1])
	// logged before Run publishes the sequence's error, as machined does (dmesg.go upgradeFailedLog)
	n.logMachined(upgradeFailedLog(phases[install][0], install+1, len(phases), reason)...)
	bus.publish(actorID, &machine.SequenceEvent{Sequence: "upgrade", Action: machine.SequenceEvent_NOOP, Error: &common.Error{
		Code:    common.Code_FATAL,
		Message: fmt.Sprintf("sequence failed: error running phase %d in upgrade sequence: task 1/1: failed, %s", install+1, reason),
	}})
}

// installExitFailure is fail_install's reason: the installer container's exit.
const installExitFailure = `task "upgrade" failed: exit code 1`
