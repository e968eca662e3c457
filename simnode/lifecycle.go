package main

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"google.golang.org/grpc/status"
)

// failedBootCountdown is how long machined counts down before rebooting after a failed boot
// (talos@v1.12.0:internal/app/machined/main.go:119-125, "rebooting in %d seconds").
const failedBootCountdown = 10 * time.Second

// The node's API goes down right after stopAllServices starts (apid is one of the services it stops) and stays
// down for reboot_ms. talosctl's tracker re-watches 1 s after the stopAllServices event with tail 0
// (action/node.go:270-272; go-retry Constant's default unit); only an Unavailable watch resets the tail to -1
// (:172-180), so reboot_ms must exceed ~1 s or the tracker misses the new boot's "ready" and waits until
// --timeout (as it would for a real node rebooting in under a second, which none does).

// How long an upgrade keeps the node up after the call, at Talos scale, times -time-factor (ours, no source for
// the values: a real node pulls the installer image, then the installer writes the boot assets, tens of seconds).
// They matter to talosctl: its tracker opens its event watch with tail 0 concurrently with the boot ID read and
// the upgrade call, not before them (talos@v1.12.0:cmd/talosctl/pkg/talos/action/node.go:75-97), and sees the
// upgrade sequence only because a real upgrade takes this long; a node that ran the sequence at once went down
// before a late watch was placed, and the tracker printed none of it.
const (
	installerPull  = 10 * time.Second // Upgrade's PullAndValidateInstallerImage, before the call answers; pull_ms
	installDefault = 30 * time.Second // the "upgrade" task (the installer run); install_ms
	// stopPods is the "cleanup" task, kubelet's graceful shutdown on a node with no pods to wait for (bounded by
	// logind.InhibitMaxDelay, talos@v1.12.0:internal/pkg/logind/logind.go:27; the value is ours): short, so
	// an apply that reboots a node at -time-factor 1 still goes down within a second.
	stopPods = 500 * time.Millisecond
)

// upgradePhases are the phases and tasks of the upgrade sequence on a metal node, up to the reboot
// (talos@v1.12.0:internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go:423-470; task names are the
// ones the task functions return, v1alpha1_sequencer_tasks.go). "drain" runs there against Kubernetes; here it
// is only its events (simnode has no Kubernetes API yet).
var upgradePhases = [][2]string{
	{"drain", "cordonAndDrainNode"}, {"cleanup", "stopAllPods"}, {"dbus", "stopDBus"},
	{"stopServices", "stopServicesForUpgrade"}, {"unmount", "unmountPodMounts"},
	{"unmountBind", "unmountSystemDiskBindMounts"}, {"unmountSystem", "unmountEphemeralPartition"},
	{"volumeFinalize", "teardownLifecycle"}, {"upgrade", "upgrade"}, {"meta", "reloadMeta"},
	{"kexec", "kexecPrepare"},
}

// rebootPhases are the reboot sequence's on a metal node, mode not FORCE, up to the reboot: cleanup and dbus,
// then stopAllPhaselist with kexec (v1alpha1_sequencer.go:236-253, :477-511; its unmount phase is "umount").
var rebootPhases = [][2]string{
	{"cleanup", "stopAllPods"}, {"dbus", "stopDBus"}, {"stopServices", "stopServicesForUpgrade"},
	{"umount", "unmountPodMounts"}, {"unmountBind", "unmountSystemDiskBindMounts"},
	{"unmountSystem", "unmountEphemeralPartition"}, {"volumeFinalize", "teardownLifecycle"},
	{"kexec", "kexecPrepare"},
}

// Upgrade is the legacy MachineService.Upgrade (talos@v1.12.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:486-575):
// the installer image is pulled and validated before the call answers (:497-501; an image missing from the nodes
// file's "images" fails as an image that does not pull would, with the same wrapper), then the sequence runs in
// the background and the call answers with the actor ID the events carry.
func (s *machineServer) Upgrade(ctx context.Context, in *machine.UpgradeRequest) (*machine.UpgradeResponse, error) {
	if _, err := s.node.image(in.GetImage()); err != nil {
		return nil, fmt.Errorf("error validating installer image %q: %w", in.GetImage(), err)
	}

	if err := s.node.pause(ctx, s.node.duration(s.node.spec.PullMS, installerPull)); err != nil {
		return nil, err
	}

	actorID := newUUID()

	if in.GetStage() {
		go s.node.stagedUpgrade(actorID, in.GetImage(), in.GetPreserve())
	} else {
		go s.node.upgrade(actorID, in.GetImage(), in.GetPreserve())
	}

	return &machine.UpgradeResponse{Messages: []*machine.Upgrade{{Ack: "Upgrade request received", ActorId: actorID}}}, nil
}

// Reboot is MachineService.Reboot (same file, :343-370): the reboot sequence in the background under a new
// actor ID, the actor ID at once. Its SequenceEvent "reboot" is what talosctl's tracker waits for before it
// reconnects (talos@v1.12.0:cmd/talosctl/pkg/talos/action/node.go:288-290), when its watch was placed in time.
func (s *machineServer) Reboot(_ context.Context, _ *machine.RebootRequest) (*machine.RebootResponse, error) {
	actorID := newUUID()
	go s.node.rebootAs(actorID)

	return &machine.RebootResponse{Messages: []*machine.Reboot{{ActorId: actorID}}}, nil
}

// upgrade runs the upgrade sequence up to stopAllServices (the running release's, preserve choosing its cleanup
// before 1.8: upgradePhasesOf), then reboots into image, keeping the running one to roll back to; an installer
// before 1.8 without preserve wipes /var (wipesEphemeral).
func (n *simNode) upgrade(actorID, image string, preserve bool) {
	exts, pullErr := n.configExtensions(image)

	switch {
	case n.spec.FailInstall:
		n.failInstall(actorID, preserve, installExitFailure)

		return
	case pullErr != nil:
		n.failInstall(actorID, preserve, pullErr.Error())

		return
	}

	n.runSequence(actorID, "upgrade", upgradePhasesOf(n.bootState().version, preserve, n.controlPlane()))
	n.installImage(image, preserve, exts)

	current := n.bootState().image
	n.powerOff()
	n.powerOn(image, current)
	n.runBoot()
}

// stagedUpgrade is Upgrade with stage: machined records the image in META (v1alpha1_server.go:525-560) and runs
// the stageUpgrade sequence, the reboot's phases (v1alpha1_sequencer.go:367-390). The next boot runs the install
// sequence before apid starts (talos@v1.12.0:internal/app/machined/main.go:263-271; v1alpha1_sequencer.go:151-188):
// it installs the staged image and reboots into it, so the API stays down across both reboots and the install.
func (n *simNode) stagedUpgrade(actorID, image string, preserve bool) {
	n.runSequence(actorID, "stageUpgrade", rebootPhases)

	exts, err := n.configExtensions(image) // a failed pull of a staged install is not modelled: installed without
	if err != nil {
		log.Printf("%s: staged install: %v", n.spec.Address, err)
	}

	n.installImage(image, preserve, exts)

	current := n.bootState().image
	n.powerOff()
	time.Sleep(n.rebootDelay() + n.duration(n.spec.InstallMS, installDefault)) // the first reboot, the install
	n.powerOn(image, current)
	n.runBoot()
}

// reboot is the reboot that an apply in reboot mode starts: actor "" (v1alpha1_server.go:298-299 runs it
// with context.Background()).
func (n *simNode) reboot() { n.rebootAs("") }

// rebootAs runs the reboot sequence up to stopAllServices and power-cycles the node into the image it runs, or
// into the one a LifecycleService upgrade installed, keeping the running one to roll back to.
func (n *simNode) rebootAs(actorID string) {
	n.runSequence(actorID, "reboot", rebootPhases)

	b := n.bootState()
	image, previous := b.image, ""

	if b.next != "" {
		image, previous = b.next, b.image
	}

	n.powerOff()
	n.powerOn(image, previous)
	n.runBoot()
}

// runSequence publishes a sequence's events as Controller.Run does (the sequence, then each phase and its task,
// START and STOP), each task taking taskTime, and ends with stopEverything's stopAllServices started: that
// task stops apid, so the node's API goes away before the sequence's last events.
func (n *simNode) runSequence(actorID, sequence string, phases [][2]string) {
	bus := n.bus()
	bus.publish(actorID, &machine.SequenceEvent{Sequence: sequence, Action: machine.SequenceEvent_START})
	n.runPhases(bus, actorID, phases)
	bus.publish(actorID, &machine.PhaseEvent{Phase: "stopEverything", Action: machine.PhaseEvent_START})
	bus.publish(actorID, &machine.TaskEvent{Task: "stopAllServices", Action: machine.TaskEvent_START})
}

// runPhases publishes each phase and its task, START and STOP (phaseEnd), each task taking taskTime.
func (n *simNode) runPhases(bus *eventBus, actorID string, phases [][2]string) {
	end := phaseEnd(n.bootState().version)

	for _, pt := range phases {
		bus.publish(actorID, &machine.PhaseEvent{Phase: pt[0], Action: machine.PhaseEvent_START})
		bus.publish(actorID, &machine.TaskEvent{Task: pt[1], Action: machine.TaskEvent_START})
		time.Sleep(n.taskTime(pt[1]))
		bus.publish(actorID, &machine.TaskEvent{Task: pt[1], Action: machine.TaskEvent_STOP})
		bus.publish(actorID, &machine.PhaseEvent{Phase: pt[0], Action: end})
	}
}

// taskTime is how long a task of a sequence takes: the installer run (install_ms, else installDefault scaled)
// and stopping the pods (kubelet's graceful shutdown: stopPods scaled); the other tasks are instant here.
func (n *simNode) taskTime(task string) time.Duration {
	switch task {
	case "upgrade":
		return n.duration(n.spec.InstallMS, installDefault)
	case "stopAllPods", "removeAllPods":
		return n.scaled(stopPods)
	default:
		return 0
	}
}

// phaseEnd is the action of a phase's last event: a 1.3 machined ends a phase with a second START
// (talos@v1.3.7 v1alpha1_controller.go:257-266, its deferred event), STOP from 1.4.
func phaseEnd(tag string) machine.PhaseEvent_Action {
	if !atLeast(tag, 1, 4) {
		return machine.PhaseEvent_START
	}

	return machine.PhaseEvent_STOP
}

// duration is a nodes file's *_ms value when set, else the Talos-scale default times -time-factor.
func (n *simNode) duration(ms int, talosScale time.Duration) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}

	return n.scaled(talosScale)
}

// pause waits d, or fails as the call's context does when the client goes first.
func (n *simNode) pause(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// powerOff takes the API down as a reboot does: new dials are refused, event streams end, the calls in
// flight still answer (the apply that asked for the reboot gets its reply).
func (n *simNode) powerOff() {
	n.mu.Lock()
	srv, bus := n.srv, n.events
	n.mu.Unlock()

	n.down.Store("connection-refused")
	bus.close()
	srv.GracefulStop()
}

// powerOn boots after reboot_ms (ours, no source): the persisted config becomes active, a fresh boot_id and
// event history, the image's extensions and services, then the API serves again.
func (n *simNode) powerOn(image, previous string) {
	time.Sleep(n.rebootDelay())

	n.mu.Lock()
	persisted := n.persisted
	version := n.boot.version

	if img, err := n.image(image); err == nil {
		version = img.TalosVersion
	}

	n.boot = bootInfo{
		image: image, version: version, previous: previous, bootID: newUUID(), args: n.bootArgs(image, previous),
		previousArgs: n.boot.args, exts: n.bootExtensions(image, previous), previousExts: n.boot.exts,
	}
	n.events = newEventBus()
	n.machined = nil // a new boot's kernel log
	n.mu.Unlock()

	if persisted != nil {
		if err := writeActive(context.Background(), n, persisted); err != nil {
			log.Printf("%s: boot with the persisted config: %v", n.spec.Address, err)
		}
	}

	if _, err := n.refresh(context.Background()); err != nil {
		log.Printf("%s: boot: %v", n.spec.Address, err)
	}

	n.start()
	n.down.CompareAndSwap("connection-refused", "") // unless a fault took the node down meanwhile
}

// runBoot is the boot sequence's last phase, startEverything: startAllServices waits until every service is
// up, for at most BootTimeout (talos@v1.12.0:internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer_tasks.go:419-500,
// pkg/machinery/constants/constants.go:956), scaled by -time-factor. A service still waiting then fails the
// sequence; machined reverts the bootloader and reboots (main.go:100-150): the node comes back on the image
// it ran before the upgrade.
func (n *simNode) runBoot() {
	bus := n.bus()
	bus.publish("", &machine.SequenceEvent{Sequence: "boot", Action: machine.SequenceEvent_START})
	bus.publish("", &machine.PhaseEvent{Phase: "startEverything", Action: machine.PhaseEvent_START})
	bus.publish("", &machine.TaskEvent{Task: "startAllServices", Action: machine.TaskEvent_START})
	bus.publish("", &machine.MachineStatusEvent{Stage: machine.MachineStatusEvent_BOOTING, Status: &machine.MachineStatusEvent_MachineStatus{}})
	n.publishServiceEvents(bus)

	deadline := time.Now().Add(n.scaled(constants.BootTimeout))

	for time.Now().Before(deadline) {
		if waiting := n.waiting(); len(waiting) == 0 {
			bus.publish("", &machine.TaskEvent{Task: "startAllServices", Action: machine.TaskEvent_STOP})
			bus.publish("", &machine.PhaseEvent{Phase: "startEverything", Action: phaseEnd(n.bootState().version)})
			bus.publish("", &machine.SequenceEvent{Sequence: "boot", Action: machine.SequenceEvent_STOP})
			n.publishBooted("")

			return
		}

		time.Sleep(50 * time.Millisecond)
	}

	n.failBoot(bus)
}

// failBoot publishes the failed sequence as Controller.Run does (v1alpha1_controller.go:139-157, the phase and
// task wrapping of :279-317, the multierror of pkg/conditions/all.go:44-64 with one error per service still
// waiting), counts down, and reboots into the previous image.
func (n *simNode) failBoot(bus *eventBus) {
	var waitErr *multierror.Error
	for range n.waiting() {
		waitErr = multierror.Append(waitErr, context.DeadlineExceeded)
	}

	// the metal boot sequence's phases, startEverything last (v1alpha1_sequencer.go:193-233; per release: bootPhases)
	phase := bootPhases(n.bootState().version)

	bus.publish("", &machine.SequenceEvent{Sequence: "boot", Action: machine.SequenceEvent_NOOP, Error: &common.Error{
		Code:    common.Code_FATAL,
		Message: fmt.Sprintf("sequence failed: error running phase %d in boot sequence: task 1/1: failed, %v", phase, waitErr),
	}})
	bus.publish("", &machine.SequenceEvent{Sequence: "boot", Action: machine.SequenceEvent_STOP})

	time.Sleep(n.scaled(failedBootCountdown))

	b := n.bootState()
	rollback := b.previous
	if rollback == "" {
		rollback = b.image
	}

	log.Printf("%s: boot failed, rolling back to %s", n.spec.Address, rollback)
	n.powerOff()
	n.powerOn(rollback, "")
	n.runBoot()
}

// publishServiceEvents publishes each service's state events of this boot, as machined's ServiceRunner does on
// every state change (UpdateState publishes event.AsProto(id), talos@v1.12.0:internal/app/machined/pkg/system/
// service_runner.go:73-93, events/events.go:70-77) with no actor ID (the runner's context is Background's,
// v1alpha1_events.go:214-218). talosctl's tracker prints them once it re-watches the new boot with tail -1
// ("service: <id> message: <msg> healthy: <bool>", cmd/talosctl/pkg/talos/action/node.go:163-172, :306-310):
// what it shows of a boot hung on a service is that service's last event, "Waiting for <condition>".
func (n *simNode) publishServiceEvents(bus *eventBus) {
	for _, svc := range n.currentServices() {
		for i, ev := range svc.Events {
			health := &machine.ServiceHealth{Unknown: true}
			if i == len(svc.Events)-1 && svc.Healthy != nil {
				health = &machine.ServiceHealth{Healthy: *svc.Healthy}
			}

			bus.publish("", &machine.ServiceStateEvent{
				Service: svc.ID,
				Action:  machine.ServiceStateEvent_Action(machine.ServiceStateEvent_Action_value[strings.ToUpper(ev.State)]),
				Message: ev.Msg,
				Health:  health,
			})
		}
	}
}

// waiting names the services not up yet (see derived.waiting).
func (n *simNode) waiting() []string {
	return derived{services: n.currentServices()}.waiting()
}

// publishBooted is machined's MachineStatusEvent once the node runs and is ready
// (the event talosctl's tracker waits for: action/tracker.go MachineReadyEventFn).
func (n *simNode) publishBooted(actorID string) {
	n.bus().publish(actorID, &machine.MachineStatusEvent{
		Stage:  machine.MachineStatusEvent_RUNNING,
		Status: &machine.MachineStatusEvent_MachineStatus{Ready: true},
	})
}

// scaled is a Talos duration times -time-factor.
func (n *simNode) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * n.factor)
}
