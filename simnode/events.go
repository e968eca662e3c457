package main

import (
	"crypto/rand"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/rs/xid"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// machined's event buffer: NewEvents(1000, 10) (talos@v1.12.0:internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_controller.go:49),
// a ring of 1000 events of which the newest 990 (capacity minus the safety gap) can be tailed.
const (
	eventCapacity = 1000
	eventGap      = 10
)

type busEvent struct {
	id  xid.ID
	msg *machine.Event
}

// eventBus is one boot's machined event stream, the ring buffer of
// talos@v1.12.0:internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_events.go: publishers write at writePos, each
// watcher reads from its own position, so a watch that attaches late still gets what it asks to tail. The
// buffer lives in machined's memory, so a reboot closes it (the watchers' streams end, as a node going down
// ends them) and the next boot starts an empty one.
type eventBus struct {
	mu       sync.Mutex
	stream   []busEvent
	writePos int64
	wake     chan struct{} // closed and replaced at each publish (the sync.Cond broadcast of the original)
	closed   bool
}

func newEventBus() *eventBus {
	return &eventBus{stream: make([]busEvent, eventCapacity), wake: make(chan struct{})}
}

// publish stamps the event as runtime.NewEvent/ToMachineEvent do (talos@v1.12.0:internal/app/machined/pkg/runtime/events.go:127-159):
// type URL talos/runtime/<full proto name>, an xid as its ID (time-ordered: tail_id and tail_seconds use it),
// the actor ID.
func (b *eventBus) publish(actorID string, payload proto.Message) {
	value, err := proto.Marshal(payload)
	if err != nil {
		panic(err) // our own messages always marshal
	}

	id := xid.New()
	ev := &machine.Event{
		Data:    &anypb.Any{TypeUrl: "talos/runtime/" + string(payload.ProtoReflect().Descriptor().FullName()), Value: value},
		Id:      id.String(),
		ActorId: actorID,
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	if b.closed {
		return
	}

	b.stream[b.writePos%eventCapacity] = busEvent{id: id, msg: ev}
	b.writePos++

	close(b.wake)
	b.wake = make(chan struct{})
}

// watchOptions are EventsRequest's tail_events, tail_id, tail_seconds and with_actor_id
// (talos@v1.12.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:1400-1421).
type watchOptions struct {
	tailEvents  int32
	tailID      xid.ID
	tailSeconds int32
	actorID     string
}

// eventCursor is one watcher's read position in a bus.
type eventCursor struct {
	bus     *eventBus
	pos     int64
	actorID string
}

// watch places a cursor as Events.Watch does (v1alpha1_events.go:124-156): by default at the next event to be
// published; tail n: n events back, -1: as far back as the buffer holds; tail_id: after that event; tail_seconds:
// the events of the last seconds. Never further back than capacity minus gap.
func (b *eventBus) watch(opts watchOptions) *eventCursor {
	b.mu.Lock()
	defer b.mu.Unlock()

	pos := b.writePos
	minPos := max(b.writePos-int64(eventCapacity-eventGap), 0)
	after := func(pred func(busEvent) bool) int64 {
		return minPos + int64(sort.Search(int(pos-minPos), func(i int) bool { return pred(b.stream[(minPos+int64(i))%eventCapacity]) }))
	}

	switch {
	case opts.tailEvents < 0:
		pos = minPos
	case opts.tailEvents > 0:
		pos = max(pos-int64(opts.tailEvents), minPos)
	case !opts.tailID.IsNil():
		pos = after(func(e busEvent) bool { return e.id.Compare(opts.tailID) > 0 })
	case opts.tailSeconds != 0:
		since := time.Now().Add(-time.Duration(opts.tailSeconds) * time.Second)
		pos = after(func(e busEvent) bool { return e.id.Time().After(since) })
	}

	return &eventCursor{bus: b, pos: pos, actorID: opts.actorID}
}

// next is the cursor's next event matching its actor filter; nil with a channel that closes at the next publish
// when it has caught up; ok false once it has caught up with a boot that ended (what was published before the
// API went down still reaches the watcher: stopAllServices stops apid after its START event is out), or when
// the watcher fell a whole buffer behind (machined ends the stream then: "buffer overrun, there's no way to
// signal error", v1alpha1_events.go:179-185).
func (c *eventCursor) next() (ev *machine.Event, wake <-chan struct{}, ok bool) {
	b := c.bus

	b.mu.Lock()
	defer b.mu.Unlock()

	for {
		switch {
		case b.writePos-c.pos >= eventCapacity, c.pos == b.writePos && b.closed:
			return nil, nil, false
		case c.pos == b.writePos:
			return nil, b.wake, true
		}

		e := b.stream[c.pos%eventCapacity]
		c.pos++

		if c.actorID == "" || e.msg.GetActorId() == c.actorID {
			return e.msg, nil, true
		}
	}
}

func (b *eventBus) close() {
	b.mu.Lock()
	defer b.mu.Unlock()

	if !b.closed {
		b.closed = true
		close(b.wake)
	}
}

// Events serves machined's Events (talos@v1.12.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:1392-1462):
// an empty "hello" event first (the client discards it; it is sent before the watch is placed, as there), then
// the tail the request asks for, then live events until the client goes or the boot ends.
func (s *machineServer) Events(in *machine.EventsRequest, srv grpc.ServerStreamingServer[machine.Event]) error {
	hello := &machine.Event{Data: &anypb.Any{}, Id: xid.New().String(), ActorId: in.GetWithActorId()}
	if err := srv.Send(hello); err != nil {
		return err
	}

	opts := watchOptions{tailEvents: in.GetTailEvents(), tailSeconds: in.GetTailSeconds(), actorID: in.GetWithActorId()}

	if in.GetTailId() != "" {
		id, err := xid.FromString(in.GetTailId())
		if err != nil {
			return fmt.Errorf("error parsing tail_id: %w", err) // :1409-1412, after the hello
		}

		opts.tailID = id
	}

	cursor := s.node.bus().watch(opts)

	for {
		ev, wake, ok := cursor.next()

		switch {
		case !ok:
			return nil
		case ev == nil:
			select {
			case <-srv.Context().Done():
				return srv.Context().Err()
			case <-wake:
			}
		default:
			if err := srv.Send(ev); err != nil {
				return err
			}
		}
	}
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
