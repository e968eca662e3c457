// Command simnode serves the Talos API of simulated nodes to the real talosctl.
//
// One process plays apid on 127.0.0.1 (mTLS, routing by the "node"/"nodes" gRPC metadata) and, behind it,
// one machined per node (MachineService and the COSI state) built from a JSON nodes file. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/siderolabs/grpc-proxy/proxy"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// errUsage marks bad input: exit status 2.
var errUsage = errors.New("usage")

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "simnode: %v\n", err)

		if errors.Is(err, errUsage) {
			os.Exit(2)
		}

		os.Exit(1)
	}
}

func run() error {
	nodesPath := flag.String("nodes", "", "JSON file with the state of every simulated node (see README.md)")
	stateDir := flag.String("state-dir", "", "owner-only directory for the talosconfig and the endpoint file")
	listen := flag.String("listen", "127.0.0.1:0", "address of the simulated apid endpoint (127.0.0.1 only)")
	resolver := flag.String("image-resolver", "", "executable asked what an installer image not in the nodes file's \"images\" installs (argv: the image reference; stdout: an \"images\" entry as JSON)")
	factor := flag.Float64("time-factor", 1, "scales Talos-scale durations (BootTimeout 70m, the 10 s failed-boot countdown, an upgrade's 10 s pull and 30 s install unless pull_ms/install_ms are set): 0.001 makes a hung boot fail after 4.2 s")
	parentPid := flag.Int("parent-pid", 0, "stop when this process is gone (with -parent-start: the simulator daemon that owns the nodes)")
	parentStart := flag.String("parent-start", "", "-parent-pid's start time in clock ticks since boot (/proc/<pid>/stat field 22), so a reused pid is not taken for it")
	flag.Parse()

	if err := parentFlags(*parentPid, *parentStart); err != nil {
		return err
	}

	if *factor <= 0 || *factor > 1 {
		return fmt.Errorf("%w: -time-factor %v must be in (0, 1]", errUsage, *factor)
	}

	if *nodesPath == "" || *stateDir == "" {
		return fmt.Errorf("%w: -nodes and -state-dir are required", errUsage)
	}

	host, _, err := net.SplitHostPort(*listen)
	if err != nil || host != "127.0.0.1" {
		return fmt.Errorf("%w: -listen %q must be 127.0.0.1:<port> (the server certificate is for 127.0.0.1)", errUsage, *listen)
	}

	nf, err := loadNodes(*nodesPath)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}

	if err = ensureStateDir(*stateDir); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if ctx, err = followParent(ctx, *parentPid, *parentStart); err != nil {
		return err
	}

	return serve(ctx, nf, options{nodesPath: *nodesPath, stateDir: *stateDir, listen: *listen, factor: *factor, resolver: *resolver})
}

// options are simnode's flags after validation.
type options struct {
	nodesPath, stateDir, listen, resolver string
	factor                                float64
}

// serve starts every node, then the front; it writes the talosconfig and <state-dir>/endpoint only once
// everything answers, so a caller waiting for the endpoint file never sees a half-started simulator.
func serve(ctx context.Context, nf *NodesFile, opt options) error {
	nodesPath, stateDir, listen := opt.nodesPath, opt.stateDir, opt.listen

	backends, err := startNodes(ctx, nf, newImageCatalog(nf.Images, opt.resolver), opt.factor)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}

	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("-listen %s: %w", listen, err)
	}

	endpoint := lis.Addr().String()

	keys, err := newPKI(stateDir, endpoint)
	if err != nil {
		return err
	}

	local, _ := backends.get(nf.Nodes[0].Address) //nolint:errcheck // validated addresses
	front := newRouter(local, backends)

	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(keys.serverTLS)),
		grpc.ForceServerCodecV2(proxy.Codec()),
		grpc.UnknownServiceHandler(proxy.TransparentHandler(front.Director, proxy.WithStreamedDetector(front.StreamedDetector))),
		grpc.MaxRecvMsgSize(constants.GRPCMaxMessageSize),
	)

	go func() {
		<-ctx.Done()
		srv.Stop()
	}()

	go reloadOnHangup(ctx, nodesPath, backends)

	if err = observe(ctx, filepath.Join(stateDir, "observed"), backends.nodes); err != nil {
		return err
	}

	if err = writeEndpoint(stateDir, endpoint); err != nil {
		return err
	}

	fmt.Printf("simnode: serving %d nodes on %s\n", len(nf.Nodes), endpoint)

	return srv.Serve(lis)
}

// startNodes builds each node's state and starts its machined.
func startNodes(ctx context.Context, nf *NodesFile, catalog *imageCatalog, factor float64) (*backendSet, error) {
	set := &backendSet{byTarget: map[string]*nodeBackend{}, nodes: map[string]*simNode{}}

	for i := range nf.Nodes {
		node, err := newSimNode(ctx, &nf.Nodes[i], catalog, factor)
		if err != nil {
			return nil, err
		}

		set.nodes[node.spec.Address] = node
	}

	return set, nil
}

// reloadOnHangup re-reads the nodes file on SIGHUP and applies each node's "down" (the only field that
// changes at run time so far: a fault switched on or off). A file that does not load, or that adds,
// removes or readdresses nodes, is refused as a whole and logged; the running nodes are left as they are.
func reloadOnHangup(ctx context.Context, nodesPath string, backends *backendSet) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)

	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}

		if err := reloadDown(nodesPath, backends); err != nil {
			log.Printf("SIGHUP: nodes file not applied: %v", err)
		}
	}
}

func reloadDown(nodesPath string, backends *backendSet) error {
	nf, err := loadNodes(nodesPath)
	if err != nil {
		return err
	}

	if len(nf.Nodes) != len(backends.nodes) {
		return fmt.Errorf("%d nodes, simnode runs %d: only \"down\" may change while running", len(nf.Nodes), len(backends.nodes))
	}

	for _, spec := range nf.Nodes {
		if backends.nodes[spec.Address] == nil {
			return fmt.Errorf("node %s (%s) is not running: only \"down\" may change while running", spec.Name, spec.Address)
		}
	}

	for _, spec := range nf.Nodes {
		backends.nodes[spec.Address].setDown(spec.Down)
	}

	return nil
}

// latency delays every call a node answers, standing for the network round trip between apid and the node
// (ours, no source: a parameter). It makes visible which talosctl commands visit nodes one after another.
func latency(d time.Duration) []grpc.ServerOption {
	if d == 0 {
		return nil
	}

	return []grpc.ServerOption{
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			time.Sleep(d)

			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			time.Sleep(d)

			return h(srv, ss)
		}),
	}
}

func writeEndpoint(stateDir, endpoint string) error {
	path := filepath.Join(stateDir, "endpoint")
	tmp := path + ".tmp"

	if err := os.WriteFile(tmp, []byte(endpoint+"\n"), 0o600); err != nil {
		return err
	}

	return os.Rename(tmp, path)
}
