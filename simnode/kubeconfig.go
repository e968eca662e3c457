package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"go.yaml.in/yaml/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// kubeconfigPath is the admin kubeconfig a control-plane node hands out. A real machined generates it from
// the cluster config (kubeconfig.GenerateAdmin); simnode has no Kubernetes of its own, so it serves the one of
// the control plane the simulated cluster runs (runbook_lib/sim/realkube.py writes it). It is read at each call:
// the control plane may start after simnode.
var kubeconfigPath = flag.String("kubeconfig", "", "admin kubeconfig a control-plane node answers MachineService.Kubeconfig with (read at each call; empty: Unimplemented, no Kubernetes API)")

// talosKubeconfigPath is the admin kubeconfig with the structure Talos generates (one cluster with its CA, one
// user with a client certificate and key, no token: talos@v1.14.1 pkg/kubeconfig/generate.go:102-124), which
// talosctl 1.14 requires of the kubeconfig it fetches (pkg/kubeconfig/validate.go:29, 149-176: its upgrade drain
// refuses a token user). The real control plane writes it: simkube keeps its CA key and signs the admin client
// certificate (simkube/admincert.go), and runbook_lib/sim/realkube.py write_talos_kubeconfig points it at the
// user's relay (or, when simkube wrote none, removes it and says why). It is served only while its server is the
// one -kubeconfig names, so one left by a control plane that is gone is never handed out.
var talosKubeconfigPath = flag.String("talos-kubeconfig", "", "admin kubeconfig with Talos's structure (client certificate), served instead of -kubeconfig while both name the same server")

// Kubeconfig is MachineService.Kubeconfig (talos@v1.13.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:1241-1285):
// only a control-plane node has it (machinehelper.CheckControlplane, internal/app/internal/machinehelper/machinehelper.go:23-38),
// and it sends the admin kubeconfig as a .tar.gz holding one file "kubeconfig" (mode 0600), in one message,
// which the client unpacks (pkg/machinery/client Kubeconfig). talosctl 1.13's upgrade --drain fetches it from the
// endpoint to cordon, drain and uncordon the node (cmd/talosctl/cmd/talos/drain.go:33-36, 116-120).
func (s *machineServer) Kubeconfig(_ *emptypb.Empty, srv grpc.ServerStreamingServer[common.Data]) error {
	cfg := s.node.activeConfig()

	switch {
	case cfg == nil || cfg.Machine() == nil:
		return status.Errorf(codes.Unimplemented, "machine type is not set, cannot use %s API", "kubeconfig")
	case !cfg.Machine().Type().IsControlPlane():
		return status.Errorf(codes.Unimplemented, "%s is only available on control plane nodes", "kubeconfig")
	case *kubeconfigPath == "":
		return status.Error(codes.Unimplemented, "simnode: no Kubernetes API to hand out a kubeconfig for (-kubeconfig)")
	}

	content, err := os.ReadFile(*kubeconfigPath)
	if err != nil {
		return status.Errorf(codes.Unavailable, "simnode: the control plane's kubeconfig is not there yet: %v", err)
	}

	if *talosKubeconfigPath != "" {
		if talos, err := os.ReadFile(*talosKubeconfigPath); err == nil && kubeServer(talos) != "" && kubeServer(talos) == kubeServer(content) {
			content = talos
		}
	}

	archive, err := tarGz("kubeconfig", content)
	if err != nil {
		return err
	}

	return srv.Send(&common.Data{Bytes: archive})
}

// kubeServer is the server URL of a kubeconfig's first cluster ("" when it has none or does not parse).
func kubeServer(content []byte) string {
	var doc struct {
		Clusters []struct {
			Cluster struct {
				Server string `yaml:"server"`
			} `yaml:"cluster"`
		} `yaml:"clusters"`
	}

	if err := yaml.Unmarshal(content, &doc); err != nil || len(doc.Clusters) == 0 {
		return ""
	}

	return doc.Clusters[0].Cluster.Server
}

// tarGz wraps one file as machined does for the Copy protocol (same function, :1255-1280).
func tarGz(name string, content []byte) ([]byte, error) {
	var buf bytes.Buffer

	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)

	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(content)), ModTime: time.Now(), Mode: 0o600}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}

	if _, err := tw.Write(content); err != nil {
		return nil, err
	}

	if err := tw.Close(); err != nil {
		return nil, err
	}

	if err := zw.Close(); err != nil {
		return nil, err
	}

	return buf.Bytes(), nil
}

// createNodename is the Nodename resource (k8s namespace) talosctl's drain reads to find the Kubernetes node of
// a Talos node (talos@v1.13.0:cmd/talosctl/pkg/talos/nodedrain/nodedrain.go:35-46). machined's NodenameController
// derives it from the hostname, lowercased (internal/app/machined/pkg/controllers/k8s/nodename.go:56-83,
// internal/nodename/nodename.go:24); simnode takes the platform metadata's hostname, else the node's name.
func createNodename(ctx context.Context, st state.State, n *NodeSpec) error {
	hostname := n.Name
	if n.PlatformMetadata != nil && n.PlatformMetadata.Hostname != "" {
		hostname = n.PlatformMetadata.Hostname
	}

	res := k8s.NewNodename(k8s.NamespaceName, k8s.NodenameID)
	res.TypedSpec().Nodename = strings.ToLower(hostname)
	res.TypedSpec().HostnameVersion = "1"

	if err := st.Create(ctx, res, state.WithCreateOwner("k8s.NodenameController")); err != nil {
		return fmt.Errorf("nodename: %w", err)
	}

	return nil
}
