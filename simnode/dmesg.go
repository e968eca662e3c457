package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
)

// kernelStart stands for the kernel's boot time in the timestamps Dmesg sends: simnode does not model when a node
// booted (a real node's messages carry the boot time plus each message's clock, go-kmsg v0.1.4 message.go).
var kernelStart = time.Now().UTC()

// kmsgLine is one kernel log record: its priority (go-kmsg v0.1.4 message.go Priority.String) and text, and its
// facility when it is not the kernel's (machined's lines, talosLine).
type kmsgLine struct {
	priority, text string
	facility       string
}

// talosLine is one line machined logs: on a node (not in a container) its standard logger writes to /dev/kmsg with
// the prefix "[talos] " (talos@v1.12.0 internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_controller.go:71-107,
// kmsg.SetupLogger), through go-kmsg v0.1.4 writer.go, which writes no "<N>" priority; the kernel gives such a
// write facility LOG_USER and the default loglevel, warning (linux kernel/printk/printk.c devkmsg_write; no tag
// checked), so talosctl dmesg prints it as "user: warning: …".
func talosLine(text string) kmsgLine {
	return kmsgLine{priority: "warning", text: "[talos] " + text, facility: "user"}
}

// upgradeFailedLog is what machined logs of an upgrade whose install task failed (failInstall): runTask's
// "task %s (%s): failed: %s" (v1alpha1_controller.go:341-350), runPhase's caller's "phase %s (%s): failed"
// (:273-283), run's "%s sequence: failed" (:248-256), and the Upgrade handler's "upgrade failed:" with run's error
// (v1alpha1_server.go:558-562, the wrapping of v1alpha1_controller.go:280 and :316). Only these failure lines are
// simulated: a real log has every phase's and task's "starting"/"done" lines before them.
func upgradeFailedLog(phase string, number, phases int, reason string) []kmsgLine {
	return []kmsgLine{
		talosLine("task upgrade (1/1): failed: " + reason),
		talosLine(fmt.Sprintf("phase %s (%d/%d): failed", phase, number, phases)),
		talosLine("upgrade sequence: failed"),
		talosLine(fmt.Sprintf("upgrade failed: error running phase %d in upgrade sequence: task 1/1: failed, %s", number, reason)),
	}
}

// kernelMessages are the NVIDIA driver's kernel log lines of this boot: what the runbook's fixes send an operator
// to (`talosctl -n <node> dmesg | grep NVRM`) and its diagnosis matches (runbook_lib/model/diagnosis.py). Only the
// driver's lines are simulated; a real node's log has the whole boot before them. None unless the kmod extension
// is booted and the config loads nvidia.
//   - Loaded: "NVRM: loading <the version file's first line>" (NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/
//     nv.c prints "NVRM: loading %s" with the same NVRM_ID string /proc/driver/nvidia/version starts with; no tag
//     checked).
//   - No NVIDIA GPU (pci_devices without one): "NVRM: No NVIDIA GPU found." (nv.c, as faults.go cites; no tag).
//   - nvidia_probe_fails: the probe-failure lines of the kernel log quoted in siderolabs/extensions#227 (as the
//     Python simulator's unsupported_gpu_message has them, runbook_lib/sim/state.py), the device-specific
//     "is not supported" lines left out, since the fault also stands for a GPU that fell off the bus.
//
// The priorities are not from a source: "info" for the loading line, "err" for the failures.
func kernelMessages(spec *NodeSpec, img ImageSpec, wanted []string, d derived) []kmsgLine {
	i := slices.IndexFunc(img.Extensions, func(e ExtensionSpec) bool { return isKmodExtension(e.Name) })
	if i < 0 || !slices.Contains(wanted, "nvidia") {
		return nil
	}

	if d.driverBound() {
		first, _, _ := strings.Cut(strings.TrimPrefix(driverVersion(img.Extensions[i]), "NVRM version: "), "\n")

		return []kmsgLine{{priority: "info", text: "NVRM: loading " + first}}
	}

	gpus := []string{}

	for _, dev := range spec.PCIDevices {
		if isNvidiaGPU(dev) {
			gpus = append(gpus, dev.ID)
		}
	}

	if len(spec.PCIDevices) > 0 && len(gpus) == 0 {
		return []kmsgLine{{priority: "err", text: "NVRM: No NVIDIA GPU found."}}
	}

	if len(gpus) == 0 {
		gpus = []string{"0000:01:00.0"} // a nodes file without pci_devices: the GPU's address is not known
	}

	var out []kmsgLine

	for _, bus := range gpus {
		out = append(out, kmsgLine{priority: "err", text: "nvidia: probe of " + bus + " failed with error -1"})
	}

	return append(out,
		kmsgLine{priority: "err", text: fmt.Sprintf("NVRM: The NVIDIA probe routine failed for %d device(s).", len(gpus))},
		kmsgLine{priority: "err", text: "NVRM: None of the NVIDIA devices were initialized."},
	)
}

// Dmesg is MachineService.Dmesg (talos@v1.12.0 internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go
// Dmesg): each record as "%s: %7s: [%s]: %s", facility, priority, RFC 3339 timestamp and the message with its
// newline (go-kmsg keeps the record's "\n"), which talosctl prints after "<node>: " (cmd/talosctl/cmd/talos/
// dmesg.go). With follow the stream stays open until the client ends it, as the kernel log's reader does; tail
// (only new messages) sends none of the existing ones.
func (s *machineServer) Dmesg(in *machine.DmesgRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	if !in.GetTail() {
		for i, line := range s.node.kernelLog() {
			at := kernelStart.Add(time.Duration(i+1) * time.Second).Format(time.RFC3339Nano)
			facility := line.facility
			if facility == "" {
				facility = "kern"
			}

			text := fmt.Appendf(nil, "%s: %7s: [%s]: %s\n", facility, line.priority, at, line.text)

			if err := srv.Send(&common.Data{Bytes: text}); err != nil {
				return err
			}
		}
	}

	if in.GetFollow() {
		<-srv.Context().Done()
	}

	return nil
}

func (n *simNode) kernelLog() []kmsgLine {
	n.mu.Lock()
	defer n.mu.Unlock()

	return append(slices.Clip(n.kmsg), n.machined...)
}

// logMachined adds lines machined logs to this boot's kernel log. Apart from the driver's lines, which a config
// change re-derives (refresh), they stay until the node boots again, as the kernel's ring buffer keeps them.
func (n *simNode) logMachined(lines ...kmsgLine) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.machined = append(slices.Clip(n.machined), lines...)
}

// lifecycleUpgradeFailedLog is what machined logs when the installer container of a LifecycleService upgrade
// (Talos 1.13 and later) exits non-zero: the upgrade's sendExitCode callback's "upgrade failed: exit_code=%d", then
// runInstallerContainer's "installer container exited with code %d" (talos@v1.13.0 internal/app/lifecycle/
// lifecycle.go:211-217 and container.go:212-219). Its "starting upgrade: installer_image=%s, disk=%s" line before
// them is left out: simnode has no system disk to name.
func lifecycleUpgradeFailedLog(code int32) []kmsgLine {
	return []kmsgLine{
		talosLine(fmt.Sprintf("upgrade failed: exit_code=%d", code)),
		talosLine(fmt.Sprintf("installer container exited with code %d", code)),
	}
}
