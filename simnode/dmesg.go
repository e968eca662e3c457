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

// kmsgLine is one kernel log record: its priority (go-kmsg v0.1.4 message.go Priority.String) and text.
type kmsgLine struct {
	priority, text string
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

		return []kmsgLine{{"info", "NVRM: loading " + first}}
	}

	gpus := []string{}

	for _, dev := range spec.PCIDevices {
		if isNvidiaGPU(dev) {
			gpus = append(gpus, dev.ID)
		}
	}

	if len(spec.PCIDevices) > 0 && len(gpus) == 0 {
		return []kmsgLine{{"err", "NVRM: No NVIDIA GPU found."}}
	}

	if len(gpus) == 0 {
		gpus = []string{"0000:01:00.0"} // a nodes file without pci_devices: the GPU's address is not known
	}

	var out []kmsgLine

	for _, bus := range gpus {
		out = append(out, kmsgLine{"err", "nvidia: probe of " + bus + " failed with error -1"})
	}

	return append(out,
		kmsgLine{"err", fmt.Sprintf("NVRM: The NVIDIA probe routine failed for %d device(s).", len(gpus))},
		kmsgLine{"err", "NVRM: None of the NVIDIA devices were initialized."},
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
			text := fmt.Appendf(nil, "%s: %7s: [%s]: %s\n", "kern", line.priority, at, line.text)

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

	return n.kmsg
}
