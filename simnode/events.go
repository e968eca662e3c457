package main

import (
	"crypto/rand"
	"fmt"
	"sync"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// eventBus is one boot's machined event stream (talos@v1.12.0:internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_events.go):
// a history the Events call can tail, and the live watchers. A reboot closes it (the watchers' streams end, as
// a node going down ends them) and the next boot starts an empty one, as machined does.
type eventBus struct {
	mu       sync.Mutex
	history  []*machine.Event
	watchers map[chan *machine.Event]struct{}
	closed   bool
}

func newEventBus() *eventBus { return &eventBus{watchers: map[chan *machine.Event]struct{}{}} }

// publish stamps the event as runtime.NewEvent/ToMachineEvent do (talos@v1.12.0:internal/app/machined/pkg/runtime/events.go:127-159):
// type URL talos/runtime/<full proto name>, a fresh ID (an xid there, a random hex string here), the actor ID.
func (b *eventBus) publish(actorID string, payload proto.Message) {
	value, err := proto.Marshal(payload)
	if err != nil {
		panic(err) // our own messages always marshal
	}

	ev := &machine.Event{
		Data:    &anypb.Any{TypeUrl: "talos/runtime/" + string(payload.ProtoReflect().Descriptor().FullName()), Value: value},
		Id:      randomHex(10),
		ActorId: actorID,
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	if b.closed {
		return
	}

	b.history = append(b.history, ev)

	for w := range b.watchers {
		select {
		case w <- ev:
		default: // a watcher 1024 events behind loses events rather than stalling the node (ours)
		}
	}
}

// watch returns the tailed history (tail 0: none, -1: all, n: the last n) and a channel of what follows;
// the channel closes when the bus does.
func (b *eventBus) watch(tail int32) ([]*machine.Event, chan *machine.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()

	ch := make(chan *machine.Event, 1024)

	start := len(b.history)
	if tail < 0 {
		start = 0
	} else if int(tail) < start {
		start -= int(tail)
	} else {
		start = 0
	}

	past := append([]*machine.Event(nil), b.history[start:]...)

	if b.closed {
		close(ch)
	} else {
		b.watchers[ch] = struct{}{}
	}

	return past, ch
}

func (b *eventBus) unwatch(ch chan *machine.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()

	if _, ok := b.watchers[ch]; ok {
		delete(b.watchers, ch)
		close(ch)
	}
}

func (b *eventBus) close() {
	b.mu.Lock()
	defer b.mu.Unlock()

	b.closed = true

	for w := range b.watchers {
		delete(b.watchers, w)
		close(w)
	}
}

// Events serves machined's Events (talos@v1.12.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:1392-1462):
// an empty "hello" event first (the client discards it), then the tail, then live events. tail_id,
// tail_seconds and with_actor_id are not simulated (talosctl's tracker uses only tail_events).
func (s *machineServer) Events(in *machine.EventsRequest, srv grpc.ServerStreamingServer[machine.Event]) error {
	if err := srv.Send(&machine.Event{Data: &anypb.Any{}, Id: randomHex(10), ActorId: in.GetWithActorId()}); err != nil {
		return err
	}

	bus := s.node.bus()
	past, ch := bus.watch(in.GetTailEvents())

	defer bus.unwatch(ch)

	for _, ev := range past {
		if err := srv.Send(ev); err != nil {
			return err
		}
	}

	for {
		select {
		case <-srv.Context().Done():
			return srv.Context().Err()
		case ev, ok := <-ch:
			if !ok {
				return nil
			}

			if err := srv.Send(ev); err != nil {
				return err
			}
		}
	}
}

// randomHex is n random bytes in hex (event IDs, and via newUUID the actor and boot IDs).
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}

	return fmt.Sprintf("%x", b)
}

// newUUID is a random (version 4) UUID, the form of machined's actor IDs (uuid.New) and of the kernel's boot_id.
func newUUID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}

	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80

	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
