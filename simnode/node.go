package main

import (
	"context"
	"fmt"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cosiapi "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/api/storage"
	"github.com/siderolabs/talos/pkg/machinery/config"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"
)

// simNode is one simulated node: its COSI state, its machined (a gRPC server on an in-memory listener,
// replaced on each reboot) and whether its API is down.
type simNode struct {
	spec    *NodeSpec
	state   state.State
	down    atomic.Value         // string: "" or a downKinds key
	images  map[string]ImageSpec // the nodes file's; look images up with image() (it also asks the resolver)
	catalog *imageCatalog
	factor  float64 // scales Talos's own durations (BootTimeout, the failed-boot countdown): -time-factor

	refreshMu  sync.Mutex    // one re-derivation at a time (an apply during a boot)
	generation atomic.Uint64 // bumped on every state change the observed file shows (observe.go)

	mu        sync.Mutex
	lis       *bufconn.Listener
	srv       *grpc.Server
	persisted config.Provider // the config the next boot starts with (staged, reboot modes)
	tryTimer  *time.Timer
	events    *eventBus
	boot      bootInfo
	services  []ServiceSpec     // what ServiceList answers
	files     map[string]string // derived files (the driver's version file), before the nodes file's "files"
	kmsg      []kmsgLine        // the NVIDIA driver's kernel log lines of this boot, re-derived with the config (dmesg.go)
	machined  []kmsgLine        // machined's kernel log lines of this boot (dmesg.go talosLine): only a boot clears them
	varWiped  bool              // an upgrade re-created EPHEMERAL: the nodes file's files under /var are gone (legacy18.go)

	// pulls are the images in the node's containerd store (ImageService.Pull, lifecycle113.go).
	pulls map[string]struct{}
}

// bootInfo is what the running boot is: its installer image (the nodes file's "image", then upgrades), the
// release it runs, the image a failed boot rolls back to, and the kernel's boot_id.
type bootInfo struct {
	image, version, previous, bootID string
	next                             string // installed for the next boot (LifecycleService.Upgrade); "": image
	// The extra kernel arguments of this boot, of the boot before it, and what the last installer run wrote for
	// the next one (cmdline.go).
	args, previousArgs []string
	installed          bool
	installedArgs      []string
	// The same for the extensions an installer added from machine.install.extensions (installext.go).
	exts, previousExts, installedExts []ExtensionSpec
}

func newSimNode(ctx context.Context, spec *NodeSpec, catalog *imageCatalog, factor float64) (*simNode, error) {
	st, err := newNodeState(ctx, spec.TalosVersion)
	if err != nil {
		return nil, err
	}

	if err = populate(ctx, st, spec); err != nil {
		return nil, err
	}

	n := &simNode{
		spec: spec, state: st, images: catalog.static, catalog: catalog, factor: factor, events: newEventBus(),
		services: spec.Services,
	}
	n.boot = bootInfo{
		image: spec.Image, version: spec.TalosVersion, bootID: newUUID(), args: installArgs(n.activeConfig()),
		exts: spec.ConfigExtensions,
	}

	if _, err = n.refresh(ctx); err != nil {
		return nil, fmt.Errorf("node %s (%s): %w", spec.Name, spec.Address, err)
	}

	n.down.Store(spec.Down)
	n.start()
	n.publishBooted("")

	return n, nil
}

// refresh re-derives an imaged node's extensions, modules and services from its image and active config
// (derive.go); a node without "image" keeps what the nodes file lists.
func (n *simNode) refresh(ctx context.Context) (derived, error) {
	n.refreshMu.Lock()
	defer n.refreshMu.Unlock()
	defer n.touch()

	if err := writeModuleSpecs(ctx, n.state, n.activeConfig()); err != nil {
		return derived{}, err
	}

	b := n.bootState()
	if b.image == "" {
		return derived{services: n.currentServices()}, nil
	}

	img, err := n.image(b.image)
	if err != nil {
		return derived{}, err
	}

	img = n.spec.withFaults(withConfigExtensions(img, b.exts))
	d := deriveState(img, n.spec.moduleConfig(n.activeConfig()), n.spec.Services, time.Now())
	if err = writeDerived(ctx, n.state, d, img.TalosVersion); err != nil {
		return d, err
	}

	kmsg := kernelMessages(n.spec, img, configModules(n.activeConfig()), d)

	n.mu.Lock()
	n.services, n.files, n.kmsg = d.services, d.files, kmsg
	n.mu.Unlock()

	return d, nil
}

// file is what MachineService.Read answers for path: a derived file, else the nodes file's "files".
func (n *simNode) file(path string) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()

	if content, ok := n.files[path]; ok {
		return content, true
	}

	if n.varWiped && strings.HasPrefix(path, ephemeralMount) {
		return "", false
	}

	content, ok := n.spec.Files[path]
	if !ok && path == procModules { // a node the nodes file describes: its "kernel_modules"
		return procModulesText(n.spec.KernelModules, "", atLeast(n.boot.version, 1, 9)), true
	}

	return content, ok
}

// image is what the installer image ref installs (the nodes file's "images", then -image-resolver).
func (n *simNode) image(ref string) (ImageSpec, error) { return n.catalog.lookup(ref) }

func (n *simNode) bootState() bootInfo {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.boot
}

func (n *simNode) currentServices() []ServiceSpec {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.services
}

func (n *simNode) bus() *eventBus {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.events
}

// start serves the node's MachineService and COSI State on a fresh in-memory listener.
func (n *simNode) start() {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(latency(time.Duration(n.spec.LatencyMS) * time.Millisecond)...)
	machine.RegisterMachineServiceServer(srv, &machineServer{node: n})
	storage.RegisterStorageServiceServer(srv, storageServer{})
	registerLifecycleAPI(srv, n, n.bootState().version)
	cosiapi.RegisterStateServer(srv, stateServer(n.state, n.bootState().version))

	go srv.Serve(lis) //nolint:errcheck // ends when the server stops

	n.mu.Lock()
	old := n.srv
	n.lis, n.srv = lis, srv
	n.mu.Unlock()

	if old != nil {
		old.Stop() // a node never runs two machineds (a no-op when a reboot or a fault already stopped it)
	}

	n.touch()
}

func (n *simNode) listener() *bufconn.Listener {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.lis
}

// activeConfig is the config the node runs (the MachineConfig resource), nil when it has none.
func (n *simNode) activeConfig() config.Provider {
	res, err := safe.StateGetByID[*configres.MachineConfig](context.Background(), n.state, configres.ActiveID)
	if err != nil {
		return nil
	}

	return res.Provider()
}

// setActive makes cfg the running config; on an imaged node the modules it names load at once (machine.kernel
// applies without a reboot) and the extension services follow.
func (n *simNode) setActive(ctx context.Context, cfg config.Provider) error {
	if err := writeActive(ctx, n, cfg); err != nil {
		return err
	}

	_, err := n.refresh(ctx)

	return err
}

func (n *simNode) setPersisted(cfg config.Provider) {
	n.mu.Lock()
	n.persisted = cfg
	n.mu.Unlock()
}

// tryFor reverts to the current active config after timeout unless another apply cancels it
// (machined's RollbackToConfigAfter; the persisted config is left alone, as try never persists).
func (n *simNode) tryFor(timeout time.Duration) {
	previous := n.activeConfig()

	n.mu.Lock()
	defer n.mu.Unlock()

	if n.tryTimer != nil {
		n.tryTimer.Stop()
	}

	n.tryTimer = time.AfterFunc(timeout, func() {
		if previous == nil {
			return
		}

		if err := writeActive(context.Background(), n, previous); err != nil {
			log.Printf("%s: try mode rollback: %v", n.spec.Address, err)
		}
	})
}

func (n *simNode) cancelTry() {
	n.mu.Lock()
	defer n.mu.Unlock()

	if n.tryTimer != nil {
		n.tryTimer.Stop()
		n.tryTimer = nil
	}
}

// setDown takes the node's API down the way kind says (closing its connections, as a powered-off node's
// vanish) or, with kind "", brings it back. Used when the nodes file is re-read (SIGHUP).
func (n *simNode) setDown(kind string) {
	was, _ := n.down.Load().(string)
	if was == kind {
		return
	}

	n.down.Store(kind)
	defer n.touch()

	switch {
	case was == "":
		n.mu.Lock()
		srv := n.srv
		n.mu.Unlock()
		srv.Stop()
	case kind == "":
		n.start()
	}
}
