package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// What a node is now, for the simulated Kubernetes side: the simulated kubelet and device plugin must follow
// what the real talosctl changed (an applied config, an upgrade, a reboot, a boot that hangs and rolls back),
// so simnode writes each node's resolved state to <state-dir>/observed/<name>.json whenever it changes. The
// fields are the nodes file's (a derived node's extensions and modules as derived), plus what a boot adds:
// the boot ID and whether the boot finished. Ours, no Talos source: Talos publishes no such file.

// observeEvery is how often the observer compares each node's generation, down state and boot ID (cheap:
// no encoding unless one of them changed), so a change reaches the file within about this long.
const observeEvery = 100 * time.Millisecond

// observedNode is the JSON of <state-dir>/observed/<name>.json (simnode/README.md "Observed state"): the node's
// nodes-file entry with what runs now in place of what it started with, and the boot.
type observedNode struct {
	NodeSpec

	Booted bool   `json:"booted"`
	BootID string `json:"boot_id"`
}

// observeKey is what, unchanged, means the observed file is still true: refresh/start/setDown/writeActive bump
// the generation; a reboot changes the boot ID and the down state (powerOff/powerOn).
type observeKey struct {
	generation uint64
	down       string
	bootID     string
}

func (n *simNode) observeKey() observeKey {
	down, _ := n.down.Load().(string)

	return observeKey{generation: n.generation.Load(), down: down, bootID: n.bootState().bootID}
}

// touch marks the node's state changed for the observer.
func (n *simNode) touch() { n.generation.Add(1) }

// observe writes every node's file once (before the endpoint file, so a caller that waited for the endpoint
// finds them), then rewrites a node's file whenever its key changes, until ctx ends.
func observe(ctx context.Context, dir string, nodes map[string]*simNode) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return fmt.Errorf("observed state: %w", err)
	}

	seen := map[*simNode]observeKey{}
	pass := func() error {
		for _, n := range nodes {
			key := n.observeKey()
			if old, ok := seen[n]; ok && old == key {
				continue
			}

			if err := n.writeObserved(ctx, dir); err != nil {
				return err
			}

			seen[n] = key
		}

		return nil
	}

	if err := pass(); err != nil {
		return err
	}

	go func() {
		tick := time.NewTicker(observeEvery)
		defer tick.Stop()

		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}

			if err := pass(); err != nil {
				log.Printf("observed state: %v", err)
			}
		}
	}()

	return nil
}

// writeObserved writes the node's file atomically (temp file + rename: a reader sees the old or the new one).
func (n *simNode) writeObserved(ctx context.Context, dir string) error {
	obs, err := n.observed(ctx)
	if err != nil {
		return fmt.Errorf("node %s (%s): %w", n.spec.Name, n.spec.Address, err)
	}

	raw, err := json.Marshal(obs)
	if err != nil {
		return err
	}

	path := filepath.Join(dir, n.spec.Name+".json")
	tmp := path + ".tmp"

	if err = os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}

	return os.Rename(tmp, path)
}

// observed reads the node's state as talosctl would see it: ExtensionStatus and LoadedKernelModule resources,
// ServiceList, the active MachineConfig, the running boot.
func (n *simNode) observed(ctx context.Context) (*observedNode, error) {
	down, _ := n.down.Load().(string)
	boot := n.bootState()
	services := n.currentServices()
	obs := &observedNode{NodeSpec: *n.spec, BootID: boot.bootID}
	obs.TalosVersion, obs.Image, obs.Services, obs.Down = boot.version, boot.image, services, down
	obs.Extensions, obs.KernelModules, obs.MachineConfig = nil, nil, ""
	obs.ConfigExtensions = boot.exts
	obs.Files = n.filesOnDisk()
	obs.Booted = down == "" && len(derived{services: services}.waiting()) == 0

	exts, err := safe.StateListAll[*runtime.ExtensionStatus](ctx, n.state)
	if err != nil {
		return nil, err
	}

	exts.ForEach(func(ext *runtime.ExtensionStatus) {
		meta := ext.TypedSpec().Metadata
		obs.Extensions = append(obs.Extensions, ExtensionSpec{
			Image: ext.TypedSpec().Image, Name: meta.Name, Version: meta.Version, Author: meta.Author,
			Description: meta.Description, Compatibility: meta.Compatibility.Talos.Version,
		})
	})

	mods, err := safe.StateListAll[*runtime.LoadedKernelModule](ctx, n.state)
	if err != nil {
		return nil, err
	}

	mods.ForEach(func(mod *runtime.LoadedKernelModule) {
		spec := mod.TypedSpec()
		obs.KernelModules = append(obs.KernelModules, ModuleSpec{
			Name: mod.Metadata().ID(), Size: spec.Size, ReferenceCount: spec.ReferenceCount,
			Dependencies: spec.Dependencies, State: spec.State, Address: spec.Address,
		})
	})

	if cfg := n.activeConfig(); cfg != nil {
		if obs.MachineConfig, err = cfg.EncodeString(encoder.WithComments(encoder.CommentsDisabled)); err != nil {
			return nil, err
		}
	}

	return obs, nil
}
