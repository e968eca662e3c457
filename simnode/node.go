package main

import (
	"context"
	"log"
	"sync"
	"sync/atomic"
	"time"

	cosiapi "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"
)

// simNode is one simulated node: its COSI state, its machined (a gRPC server on an in-memory listener,
// replaced on each reboot) and whether its API is down.
type simNode struct {
	spec  *NodeSpec
	state state.State
	down  atomic.Value // string: "" or a downKinds key

	mu        sync.Mutex
	lis       *bufconn.Listener
	srv       *grpc.Server
	persisted config.Provider // the config the next boot starts with (staged, reboot modes)
	tryTimer  *time.Timer
}

func newSimNode(ctx context.Context, spec *NodeSpec) (*simNode, error) {
	st, err := newNodeState(ctx)
	if err != nil {
		return nil, err
	}

	if err = populate(ctx, st, spec); err != nil {
		return nil, err
	}

	n := &simNode{spec: spec, state: st}
	n.down.Store(spec.Down)
	n.start()

	return n, nil
}

// start serves the node's MachineService and COSI State on a fresh in-memory listener.
func (n *simNode) start() {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(latency(time.Duration(n.spec.LatencyMS) * time.Millisecond)...)
	machine.RegisterMachineServiceServer(srv, &machineServer{node: n})
	cosiapi.RegisterStateServer(srv, server.NewState(n.state))

	go srv.Serve(lis) //nolint:errcheck // ends when the server stops

	n.mu.Lock()
	old := n.srv
	n.lis, n.srv = lis, srv
	n.mu.Unlock()

	if old != nil {
		old.Stop() // a node never runs two machineds (a no-op when a reboot or a fault already stopped it)
	}
}

func (n *simNode) listener() *bufconn.Listener {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.lis
}

// reboot takes the node's API down (connections close once in-flight calls answer, new dials are refused),
// waits reboot_ms, boots with the persisted config and serves again. The duration is the nodes file's
// (ours, no source); the next session replaces it with realistic time-scaled phases.
func (n *simNode) reboot() {
	n.mu.Lock()
	srv, persisted := n.srv, n.persisted
	n.mu.Unlock()

	n.down.Store("connection-refused")
	srv.GracefulStop()
	time.Sleep(n.rebootDelay())

	if persisted != nil {
		if err := writeActive(context.Background(), n, persisted); err != nil {
			log.Printf("%s: boot with the persisted config: %v", n.spec.Address, err)
		}
	}

	n.start()
	n.down.CompareAndSwap("connection-refused", "") // unless a fault took the node down meanwhile
}

// activeConfig is the config the node runs (the MachineConfig resource), nil when it has none.
func (n *simNode) activeConfig() config.Provider {
	res, err := safe.StateGetByID[*configres.MachineConfig](context.Background(), n.state, configres.ActiveID)
	if err != nil {
		return nil
	}

	return res.Provider()
}

func (n *simNode) setActive(ctx context.Context, cfg config.Provider) error {
	return writeActive(ctx, n, cfg)
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
