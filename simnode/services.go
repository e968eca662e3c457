package main

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/constants"
)

// A node's services as machined's ServiceRunner records them. The nodes file says which base services run and
// whether their health check passed; the events each one has are machined's, derived here:
//
//   - ServiceRunner.Run records "Starting service" (Starting), then "Running pre state" and "Creating service
//     runner" (Preparing), then the runner's own Running event (talos@v1.12.0:internal/app/machined/pkg/system/
//     service_runner.go:213,258,264), and, for a service with a health check, "Health check successful" (Running)
//     once its first check passes (healthUpdate, :109-147; "Health check failed: <message>" when it fails).
//     Between Starting and Preparing machined also records "Waiting for <conditions>" for a service with
//     conditions or dependencies (:156-160): not simulated (which conditions each service waits for is not
//     modelled), so `talosctl service <id>` lists one event fewer than a real node for those.
//   - The runner's Running event: goroutine runners "Service started as goroutine" (runner/goroutine/
//     goroutine.go:71), process runners "Process Process([args]) started with PID <pid>" (runner/process/
//     process.go:457,504-506), containerd runners "Started task <id> (PID <pid>) for container <id>"
//     (runner/containerd/containerd.go:224). The same at v1.9.0 and v1.13.0 (process.go:442,485 and :468,515).
//   - Which runner each base service has (talos@v1.9.0 and v1.13.0:internal/app/machined/pkg/system/services/
//     <id>.go Runner), with its process arguments (containerd.go:91-99, cri.go:110-116, udevd.go:79-82,
//     dashboard.go:101-104 at v1.12.0, paths from pkg/machinery/constants): baseRunners.
//
// The PIDs are the kernel's, so no source gives their values: simnode gives each started process a non-zero PID,
// increasing in start order (pids), as a fresh boot would.
type runnerKind int

const (
	goroutineRunner runnerKind = iota
	processRunner
	containerdRunner
)

type baseRunner struct {
	kind runnerKind
	args []string // a process runner's ProcessArgs
}

var baseRunners = map[string]baseRunner{
	"apid":    {kind: containerdRunner},
	"auditd":  {kind: goroutineRunner},
	"kubelet": {kind: containerdRunner},
	"containerd": {kind: processRunner, args: []string{
		"/bin/containerd", "--address", constants.SystemContainerdAddress,
		"--state", filepath.Join(constants.SystemRunPath, "containerd"),
		"--root", filepath.Join(constants.SystemVarPath, "lib", "containerd"),
	}},
	"cri": {kind: processRunner, args: []string{
		"/bin/containerd", "--address", constants.CRIContainerdAddress, "--config", constants.CRIContainerdConfig,
	}},
	"dashboard": {kind: processRunner, args: []string{"/sbin/dashboard"}},
	"machined":  {kind: goroutineRunner},
	"syslogd":   {kind: goroutineRunner},
	"udevd":     {kind: processRunner, args: []string{"/sbin/systemd-udevd", "--resolve-names=never"}},
}

// firstPID is the PID simnode gives the first process a boot starts (no source: the kernel assigns them).
const firstPID = 1000

// pids hands out the PIDs of one boot's processes in start order.
type pids struct{ next int }

func (p *pids) take() int {
	if p.next == 0 {
		p.next = firstPID
	}

	p.next++

	return p.next - 1
}

// runningEvent is the runner's Running event of service id (see above); ok is false for a service simnode has
// no runner for.
func runningEvent(id string, p *pids) (string, bool) {
	r, ok := baseRunners[id]
	if !ok {
		return "", false
	}

	switch r.kind {
	case goroutineRunner:
		return "Service started as goroutine", true
	case processRunner:
		return fmt.Sprintf("Process Process(%q) started with PID %d", r.args, p.take()), true
	default:
		return startedTask(id, p.take()), true
	}
}

// startedTask is the containerd runner's Running event (runner/containerd/containerd.go:224).
func startedTask(id string, pid int) string {
	return fmt.Sprintf("Started task %s (PID %d) for container %s", id, pid, id)
}

// bootServices are the nodes file's base services as this boot's ServiceRunners record them: a Running service
// the nodes file gives no events gets machined's (see above), with its health check's event when the nodes file
// says how the check went. A service simnode has no runner for, or one with events, is kept as given.
func bootServices(base []ServiceSpec, now time.Time, p *pids) []ServiceSpec {
	out := slices.Clone(base)

	for i, svc := range out {
		if svc.State != "Running" || len(svc.Events) > 0 {
			continue
		}

		running, ok := runningEvent(svc.ID, p)
		if !ok {
			continue
		}

		out[i].Events = []EventSpec{
			{Msg: "Starting service", State: "Starting", Ts: now},
			{Msg: "Running pre state", State: "Preparing", Ts: now},
			{Msg: "Creating service runner", State: "Preparing", Ts: now},
			{Msg: running, State: "Running", Ts: now},
		}

		if svc.Healthy != nil {
			out[i].Events = append(out[i].Events, EventSpec{Msg: healthMessage(svc), State: "Running", Ts: now})
		}
	}

	return out
}

// healthMessage is healthUpdate's event (service_runner.go:119-124).
func healthMessage(svc ServiceSpec) string {
	if *svc.Healthy {
		return "Health check successful"
	}

	return "Health check failed: " + svc.LastMessage
}

// byID is the order machined lists its services in: sorted by ID (talos@v1.12.0:internal/app/machined/pkg/system/
// system.go:386-397, List; ServiceList answers in that order, internal/server/v1alpha1/v1alpha1_server.go:707-719).
func byID(services []ServiceSpec) []ServiceSpec {
	out := slices.Clone(services)
	slices.SortStableFunc(out, func(a, b ServiceSpec) int { return cmp.Compare(a.ID, b.ID) })

	return out
}
