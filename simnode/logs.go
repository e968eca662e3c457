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

// cdiNotShipped are the files `nvidia-ctk cdi generate` (ext-nvidia-cdi-gen) cannot locate on a healthy node
// because the extensions do not ship them: the lines Talos CI quotes and counts (siderolabs/talos v1.13.0
// internal/integration/api/extensions_nvidia.go:160-169, the LTS list; runbook_lib/sim/talosctl/resources.py
// _CDI_NOT_SHIPPED has the same). %[1]s stands for the driver version.
var cdiNotShipped = []string{
	"libnvidia-vulkan-producer.so.%[1]s", "X11/xorg.conf.d/10-nvidia.conf", "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
	"vulkan/implicit_layer.d/nvidia_layers.json", "vulkan/icd.d/nvidia_icd.x86_64.json", "/nvidia-fabricmanager/socket",
	"/tmp/nvidia-mps", "nvidia-imex", "nvidia-imex-ctl",
}

// cdiDriverLibs are what the generator also cannot locate when the toolkit is of another driver than the loaded
// module: the loaded driver's user-space libraries. Derived, not observed (no log of such a node at hand), as the
// Python talosctl's _CDI_DRIVER_LIBS.
var cdiDriverLibs = []string{
	"libcuda.so.%[1]s", "libnvidia-ml.so.%[1]s", "libnvidia-ptxjitcompiler.so.%[1]s", "libnvidia-nvvm.so.%[1]s",
}

// Logs is MachineService.Logs for a service's log (talos@v1.12.0 internal/app/machined/internal/server/v1alpha1/
// v1alpha1_server.go Logs: the service's log, which may be empty; follow and tail are not simulated). A service
// with no log yet fails as logRegistered says. Only ext-nvidia-cdi-gen says anything here, once Finished:
// nvidia-container-toolkit's logrus text lines, its "Could not locate" warnings as
// Warningf("Could not locate %v: %v", candidate, err) prints them (NVIDIA/nvidia-container-toolkit
// internal/discover/mounts.go; no tag checked), which the runbook's verify counts against Talos CI's baseline.
// The other lines' wording is the Python talosctl's (no source).
func (s *machineServer) Logs(in *machine.LogsRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	if systemLog(in) && !s.node.logRegistered(in.GetId()) {
		// a plain error, so gRPC code Unknown, as machined's (talos@v1.13.0 internal/app/machined/pkg/runtime/
		// logging/circular.go:235-247); apid puts it in the node's Metadata.Error and talosctl exits 1
		return fmt.Errorf("log %q was not registered", in.GetId())
	}

	text := ""
	if in.GetId() == cdiGen {
		text = s.node.cdiGenLog(time.Now().UTC())
	}

	if text == "" {
		return nil
	}

	return srv.Send(&common.Data{Bytes: []byte(text)})
}

// systemLog says whether the request reads a Talos service's in-memory log (the system namespace, or kubelet
// in any), not a Kubernetes container's (v1alpha1_server.go Logs), which simnode does not simulate.
func systemLog(in *machine.LogsRequest) bool {
	return in.GetNamespace() == "system" || in.GetId() == "kubelet"
}

// logRegistered says whether machined has a log for id: its own, and each service's once its runner opened the
// log's writer, i.e. once it started (talos@v1.13.0 internal/app/machined/pkg/system/runner/process/process.go:198,
// runner/containerd/containerd.go:170, runner/goroutine/goroutine.go:123). The log lives until the reboot, so a
// Finished one-shot keeps it; a service that only ever waited has none. Simnode knows a service's history from
// its state and events: it started if either is a state only a started service reaches.
func (n *simNode) logRegistered(id string) bool {
	started := func(state string) bool { return slices.Contains([]string{"Running", "Stopping", "Finished"}, state) }

	return id == "machined" || slices.ContainsFunc(n.currentServices(), func(s ServiceSpec) bool {
		return s.ID == id && (started(s.State) || slices.ContainsFunc(s.Events, func(e EventSpec) bool { return started(e.State) }))
	})
}

// cdiGenLog is ext-nvidia-cdi-gen's log: empty unless it Finished on a node running a kmod and a toolkit.
func (n *simNode) cdiGenLog(now time.Time) string {
	if !slices.ContainsFunc(n.currentServices(), func(s ServiceSpec) bool { return s.ID == cdiGen && s.State == "Finished" }) {
		return ""
	}

	img, err := n.image(n.bootState().image)
	if err != nil {
		return ""
	}

	exts := n.spec.withFaults(img).Extensions

	kmod, toolkit := extensionDriver(exts, isKmodExtension), extensionDriver(exts, isToolkitExtension)
	if kmod == "" || toolkit == "" {
		return ""
	}

	missing := slices.Clone(cdiNotShipped)
	if toolkit != kmod {
		missing = append(missing, cdiDriverLibs...)
	}

	stamp := fmt.Sprintf("time=%q", now.Format(time.RFC3339))
	lines := []string{fmt.Sprintf("%s level=info msg=%q", stamp, "Using driver version "+kmod)}

	for _, m := range missing {
		name := strings.ReplaceAll(m, "%[1]s", kmod) // Sprintf would append %!(EXTRA ...) to a name with no verb
		lines = append(lines, fmt.Sprintf("%s level=warning msg=%q", stamp, fmt.Sprintf("Could not locate %s: %s: not found", name, name)))
	}

	lines = append(lines, fmt.Sprintf("%s level=info msg=%q", stamp, "Generated CDI spec with version 0.8.0"))

	return strings.Join(lines, "\n") + "\n"
}

// extensionDriver is the driver version of the first extension is matches (its version before "-").
func extensionDriver(exts []ExtensionSpec, is func(string) bool) string {
	i := slices.IndexFunc(exts, func(e ExtensionSpec) bool { return is(e.Name) })
	if i < 0 {
		return ""
	}

	drv, _, _ := strings.Cut(exts[i].Version, "-")

	return drv
}
