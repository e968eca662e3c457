package main

import (
	"fmt"
	"path/filepath"
	"strings"
)

// ports are the loopback ports of one control plane, all picked free at start so parallel clusters coexist.
type ports struct {
	EtcdClient, EtcdPeer, APIServer int
}

// component is one process of the control plane: its binary name and its arguments.
type component struct {
	Name string
	Args []string
}

// layout is where a control plane keeps its files inside the state directory.
type layout struct {
	State, PKIDir, EtcdData, Logs, TokenFile, AdmissionConfig string
	EgressConfig                                              string // empty: kubelets reached directly
	Issuer                                                    string // service-account issuer and API audience
	PKI                                                       pki
	Kubeconfigs                                               map[string]string
	TalosKubeconfig, TalosKubeconfigError                     string // admincert.go
}

func etcdComponent(l layout, p ports) component {
	client := fmt.Sprintf("http://127.0.0.1:%d", p.EtcdClient)
	peer := fmt.Sprintf("http://127.0.0.1:%d", p.EtcdPeer)

	return component{Name: "etcd", Args: []string{
		"--name=simkube",
		"--data-dir=" + l.EtcdData,
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=simkube=" + peer,
		// A rehearsal store on a shared disk: fsync on every write only slows the tests down.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}}
}

// apiServerComponent uses the flags Talos v1.12.0 gives kube-apiserver where they matter to a client
// (siderolabs/talos@v1.12.0 internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go,
// manageAPIServer): NodeRestriction added to the default admission plugins (so PodSecurity and RuntimeClass
// stay on), the admission configuration file, allow-privileged, anonymous-auth=false, TLS 1.2 minimum,
// profiling off, service CIDR 10.96.0.0/12. Authorization is Node,RBAC (Talos writes the same two
// authorizers as an authorization-config file for Kubernetes >= 1.30).
// Not as Talos: etcd over plain HTTP on loopback (Talos: mTLS), a bearer-token file instead of client
// certificates, no encryption at rest, audit log, aggregator (front-proxy) certificates or kubelet client cert.
func apiServerComponent(l layout, p ports) component {
	c := component{Name: "kube-apiserver", Args: []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", p.EtcdClient),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", p.APIServer),
		"--tls-cert-file=" + l.PKI.ServingCert,
		"--tls-private-key-file=" + l.PKI.ServingKey,
		"--client-ca-file=" + l.PKI.CACert,
		"--token-auth-file=" + l.TokenFile,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--admission-control-config-file=" + l.AdmissionConfig,
		"--allow-privileged=true",
		"--anonymous-auth=false",
		"--service-account-issuer=" + l.Issuer,
		"--api-audiences=" + l.Issuer,
		"--service-account-key-file=" + l.PKI.SAPublic,
		"--service-account-signing-key-file=" + l.PKI.SAPrivate,
		"--service-cluster-ip-range=10.96.0.0/12",
		"--tls-min-version=VersionTLS12",
		"--profiling=false",
		"--enable-bootstrap-token-auth=true",
		// The "kubernetes" Service endpoints would point at 127.0.0.1, which Endpoints validation refuses.
		"--endpoint-reconciler-type=none",
	}}
	if l.EgressConfig != "" {
		// Not in Talos: the simulated nodes' addresses (10.5.0.x) are not routable, so logs and exec go through
		// the simulator's proxy (k8s.io/apiserver egress selector, "cluster" egress: traffic to nodes and pods).
		c.Args = append(c.Args, "--egress-selector-config-file="+l.EgressConfig)
	}

	return c
}

// controlLoop is a component that talks to the API server with its own kubeconfig: without leader election
// (one replica) and serving no port (10257/10259 would collide between clusters on one machine).
func controlLoop(name string, l layout, extra ...string) component {
	args := []string{"--kubeconfig=" + l.Kubeconfigs[name], "--leader-elect=false", "--secure-port=0", "--profiling=false"}

	return component{Name: name, Args: append(args, extra...)}
}

// controllerManagerComponent follows Talos's manageControllerManager where it matters here: controllers
// "*,tokencleaner" and per-controller service-account credentials.
func controllerManagerComponent(l layout) component {
	return controlLoop("kube-controller-manager", l,
		"--controllers=*,tokencleaner",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+l.PKI.SAPrivate,
		"--root-ca-file="+l.PKI.CACert,
	)
}

// components returns the processes to start, in start order, for the names asked for.
func components(names []string, l layout, p ports) ([]component, error) {
	all := map[string]component{
		"etcd":                    etcdComponent(l, p),
		"kube-apiserver":          apiServerComponent(l, p),
		"kube-controller-manager": controllerManagerComponent(l),
		"kube-scheduler":          controlLoop("kube-scheduler", l),
	}
	order := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
	want := map[string]bool{}

	for _, name := range names {
		if _, ok := all[name]; !ok {
			return nil, fmt.Errorf("--components: unknown component %q (valid: %s)", name, strings.Join(order, ","))
		}

		want[name] = true
	}

	if !want["etcd"] || !want["kube-apiserver"] {
		return nil, fmt.Errorf("--components must include etcd and kube-apiserver, got %q", strings.Join(names, ","))
	}

	var out []component

	for _, name := range order {
		if want[name] {
			out = append(out, all[name])
		}
	}

	return out, nil
}

func logPath(l layout, name string) string { return filepath.Join(l.Logs, name+".log") }
