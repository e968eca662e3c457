package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/siderolabs/grpc-proxy/proxy"
	sidnet "github.com/siderolabs/net"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// router is the apid front: the same routing as talos@v1.12.0:internal/app/apid/pkg/director/director.go
// (an internal package, so rewritten here), on a control-plane apid that forwards (remoteBackendFactory set).
type router struct {
	local    proxy.Backend
	backends *backendSet
	streamed []*regexp.Regexp
}

// streamedMethods are apid's server-streaming methods (talos@v1.12.0:internal/app/apid/main.go:122-142).
var streamedMethods = []string{
	"/machine.MachineService/Copy", "/machine.MachineService/DiskUsage", "/machine.MachineService/Dmesg",
	"/machine.MachineService/EtcdSnapshot", "/machine.MachineService/Events", "/machine.MachineService/ImageList",
	"/machine.MachineService/Kubeconfig", "/machine.MachineService/List", "/machine.MachineService/Logs",
	"/machine.MachineService/PacketCapture", "/machine.MachineService/Read", "/os.OSService/Dmesg",
	"/cluster.ClusterService/HealthCheck",
	// Talos 1.13 (talos@v1.13.0:internal/app/apid/service.go:84-101).
	"/machine.MachineService/DebugContainer", "/machine.LifecycleService/Install", "/machine.LifecycleService/Upgrade",
}

func newRouter(local proxy.Backend, backends *backendSet) *router {
	r := &router{local: local, backends: backends}
	for _, m := range streamedMethods {
		r.streamed = append(r.streamed, regexp.MustCompile("^"+regexp.QuoteMeta(m)+"$"))
	}

	r.streamed = append(r.streamed, regexp.MustCompile("Stream$"))

	return r
}

// Director: "nodes" goes one-to-many (refused for COSI), "node" one-to-one, neither to the local node
// (director.go:49-100).
func (r *router) Director(ctx context.Context, fullMethodName string) (proxy.Mode, []proxy.Backend, error) {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return proxy.One2One, []proxy.Backend{r.local}, nil
	}

	nodes, okNodes := md["nodes"]
	node, okNode := md["node"]

	if okNode && len(node) != 1 {
		return proxy.One2One, nil, status.Error(codes.InvalidArgument, "node metadata must be single-valued")
	}

	switch {
	case okNodes:
		if strings.HasPrefix(fullMethodName, "/cosi.") {
			return proxy.One2One, nil, status.Error(codes.InvalidArgument, "one-2-many proxying is not supported for COSI methods")
		}

		return r.aggregate(nodes)
	case okNode:
		b, err := r.backends.get(node[0])
		if err != nil {
			return proxy.One2One, nil, status.Error(codes.Internal, err.Error())
		}

		return proxy.One2One, []proxy.Backend{b}, nil
	default:
		return proxy.One2One, []proxy.Backend{r.local}, nil
	}
}

func (r *router) aggregate(targets []string) (proxy.Mode, []proxy.Backend, error) {
	backends := make([]proxy.Backend, len(targets))

	for i, target := range targets {
		b, err := r.backends.get(target)
		if err != nil {
			return proxy.One2Many, nil, status.Error(codes.Internal, err.Error())
		}

		backends[i] = b
	}

	return proxy.One2Many, backends, nil
}

// StreamedDetector implements proxy.StreamedDetector (director.go:134-137).
func (r *router) StreamedDetector(fullMethodName string) bool {
	return slices.ContainsFunc(r.streamed, func(re *regexp.Regexp) bool { return re.MatchString(fullMethodName) })
}

// backendSet hands out one backend per target, created on first use like apid's backend factory.
type backendSet struct {
	mu       sync.Mutex
	byTarget map[string]*nodeBackend
	nodes    map[string]*simNode
}

func (s *backendSet) get(target string) (*nodeBackend, error) {
	// NewAPID's check (talos@v1.12.0:internal/app/apid/pkg/backend/apid.go:55-58).
	if target == "" || sidnet.AddressContainsPort(target) {
		return nil, fmt.Errorf("invalid target %q", target)
	}

	s.mu.Lock()
	defer s.mu.Unlock()

	if b, ok := s.byTarget[target]; ok {
		return b, nil
	}

	b := &nodeBackend{target: target, node: s.nodes[target]}
	s.byTarget[target] = b

	return b, nil
}

// nodeBackend is apid's APID backend (talos@v1.12.0:internal/app/apid/pkg/backend/apid.go) with the network
// replaced by a dialer: a live node is reached in memory, a down one fails the dial as the kernel would.
type nodeBackend struct {
	target string
	node   *simNode // nil: no simulated node has this address

	mu   sync.Mutex
	conn *grpc.ClientConn
}

func (b *nodeBackend) String() string { return b.target }

// GetConnection copies the incoming metadata minus the routing keys, marks it proxied (apid.go:70-87) and
// dials target:50000 once, with the proxy codec (apid.go:101-125).
func (b *nodeBackend) GetConnection(ctx context.Context, _ string) (context.Context, *grpc.ClientConn, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	md = md.Copy()

	if authority := md[":authority"]; len(authority) > 0 {
		md.Set("proxyfrom", authority...)
	} else {
		md.Set("proxyfrom", "unknown")
	}

	delete(md, ":authority")
	delete(md, "nodes")
	delete(md, "node")

	outCtx := metadata.NewOutgoingContext(ctx, md)

	b.mu.Lock()
	defer b.mu.Unlock()

	if b.conn != nil {
		return outCtx, b.conn, nil
	}

	var err error

	b.conn, err = grpc.NewClient(
		fmt.Sprintf("%s:%d", sidnet.FormatAddress(b.target), constants.ApidPort),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(b.dial),
		// apid's backoff: at most 15 s between attempts, so a rebooted node is seen again soon (apid.go:95-118).
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: apidBackoff(), MinConnectTimeout: 20 * time.Second}),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(constants.GRPCMaxMessageSize),
			grpc.ForceCodecV2(proxy.Codec()),
		),
	)

	return outCtx, b.conn, err
}

// dial reaches a live node in memory. A down node, or an address no node has, fails with the error
// net.Dialer returns for that case, so gRPC reports it exactly as on a real network:
// `connection error: desc = "transport: Error while dialing: dial tcp <addr>:50000: connect: ..."`.
func (b *nodeBackend) dial(ctx context.Context, addr string) (net.Conn, error) {
	errno := syscall.EHOSTUNREACH

	if b.node != nil {
		switch b.node.down.Load().(string) {
		case "":
			return b.node.listener().DialContext(ctx)
		case "connection-refused":
			errno = syscall.ECONNREFUSED
		}
	}

	tcpAddr, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}

	return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: tcpAddr, Err: os.NewSyscallError("connect", errno)}
}

// AppendInfo adds common.Metadata{hostname: target} to each reply (apid.go:136-213).
func (b *nodeBackend) AppendInfo(streaming bool, resp []byte) ([]byte, error) {
	payload, err := proto.Marshal(&common.Empty{Metadata: &common.Metadata{Hostname: b.target}})

	if streaming {
		return append(resp, payload...), err
	}

	const (
		metadataField = 1
		metadataType  = 2
	)

	typ, n1 := protowire.ConsumeVarint(resp)
	if n1 < 0 {
		return nil, protowire.ParseError(n1)
	}

	_, n2 := protowire.ConsumeVarint(resp[n1:])
	if n2 < 0 {
		return nil, protowire.ParseError(n2)
	}

	if typ != (metadataField<<3)|metadataType {
		return nil, fmt.Errorf("unexpected message format: %d", typ)
	}

	if n1+n2 > len(resp) {
		return nil, fmt.Errorf("unexpected message size: %d", len(resp))
	}

	resp = resp[n1+n2:]
	prefix := protowire.AppendVarint(protowire.AppendVarint(nil, (metadataField<<3)|metadataType), uint64(len(resp)+len(payload)))

	return slices.Concat(prefix, resp, payload), err
}

// BuildError turns a backend error into a reply carrying only metadata with the error (apid.go:215-252):
// this is how one node's failure reaches talosctl inside a one-to-many reply.
func (b *nodeBackend) BuildError(streaming bool, err error) ([]byte, error) {
	var resp proto.Message = &common.Empty{
		Metadata: &common.Metadata{
			Hostname: b.target,
			Error:    err.Error(),
			Status:   status.Convert(err).Proto(),
		},
	}

	if !streaming {
		resp = &common.EmptyResponse{Messages: []*common.Empty{resp.(*common.Empty)}}
	}

	return proto.Marshal(resp)
}

func apidBackoff() backoff.Config {
	cfg := backoff.DefaultConfig
	cfg.MaxDelay = 15 * time.Second

	return cfg
}
