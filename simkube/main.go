// Command simkube runs a real Kubernetes control plane (etcd, kube-apiserver and optionally
// kube-controller-manager and kube-scheduler, built by tools/build-kube.sh) on 127.0.0.1 for the simulated
// cluster, configured as Talos configures it where a client can tell the difference.
//
//	simkube --state DIR --bin DIR [--components etcd,kube-apiserver,...]
//
// It writes certificates, tokens and kubeconfigs into DIR (0700) (started again on the DIR of an earlier start,
// it reuses that start's certificates, tokens, etcd data, API server port and service-account issuer, as a real
// control plane keeps its cluster and endpoint; see resumable for what it refuses), starts the processes with their logs in DIR/logs, prints one JSON line
// (server, admin kubeconfig, pids; never a token) once the API server is ready, and then supervises:
// SIGTERM/SIGINT stops everything; a component that exits stops the others. Children get SIGKILL if simkube
// itself dies, so nothing is left running. Exit 2 is bad input, 1 a failed start.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type options struct {
	State, Bin   string
	Components   []string
	Timeout      time.Duration
	KubeletProxy string
	ClusterName  string // the cluster's name in the Talos-shaped admin kubeconfig (admincert.go)
	Resume       bool   // the state directory holds an earlier start's PKI, tokens and etcd data
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func parseOptions(args []string) (options, error) {
	fs := flag.NewFlagSet("simkube", flag.ContinueOnError)
	state := fs.String("state", "", "state directory (created 0700; empty, absent, or an earlier simkube's to resume)")
	bin := fs.String("bin", "", "directory holding etcd, kube-apiserver, ... (tools/build-kube.sh prints it, plus /bin)")
	comps := fs.String("components", "etcd,kube-apiserver,kube-controller-manager,kube-scheduler", "components to run")
	timeout := fs.Duration("timeout", 120*time.Second, "how long each component may take to become ready")
	kubeletProxy := fs.String("kubelet-proxy-socket", "", "unix socket of an HTTP CONNECT proxy the API server "+
		"reaches kubelets through (logs, exec), for simulated nodes whose addresses are not routable")
	clusterName := fs.String("cluster-name", "simkube", "the cluster's name in the admin kubeconfig with Talos's structure")

	if err := fs.Parse(args); err != nil {
		return options{}, usageError{err.Error()}
	}

	if *state == "" || *bin == "" {
		return options{}, usageError{"--state and --bin are required"}
	}

	if *clusterName == "" {
		return options{}, usageError{"--cluster-name must not be empty (Talos's kubeconfig names its cluster)"}
	}

	resume, err := resumable(*state)
	if err != nil {
		return options{}, err
	}

	if *kubeletProxy != "" && !filepath.IsAbs(*kubeletProxy) {
		return options{}, usageError{fmt.Sprintf("--kubelet-proxy-socket %s is not an absolute path", *kubeletProxy)}
	}

	return options{
		State: *state, Bin: *bin, Components: strings.Split(*comps, ","), Timeout: *timeout, KubeletProxy: *kubeletProxy,
		ClusterName: *clusterName, Resume: resume,
	}, nil
}

// prepare writes every file the components read and returns the layout and the admin kubeconfig's server.
// issuer is the earlier start's service-account issuer ("" on a first start: the API server's URL).
func prepare(o options, p ports, issuer string) (layout, string, error) {
	state, err := filepath.Abs(o.State)
	if err != nil {
		return layout{}, "", err
	}

	l := layout{
		State: state, PKIDir: filepath.Join(state, "pki"), EtcdData: filepath.Join(state, "etcd"),
		Logs: filepath.Join(state, "logs"), TokenFile: filepath.Join(state, "pki", "tokens.csv"),
		AdmissionConfig: filepath.Join(state, "admission-control-config.yaml"),
	}

	for _, dir := range []string{state, l.Logs} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return layout{}, "", err
		}
	}

	if err := os.Chmod(state, 0o700); err != nil {
		return layout{}, "", err
	}

	ids, err := credentials(o.Resume, &l)
	if err != nil {
		return layout{}, "", err
	}

	server := fmt.Sprintf("https://127.0.0.1:%d", p.APIServer)
	if l.Issuer = issuer; issuer == "" {
		l.Issuer = server
	}

	if err := writeJSON(filepath.Join(state, endpointFile), endpoint{APIServerPort: p.APIServer, Issuer: l.Issuer}); err != nil {
		return layout{}, "", err
	}

	if l.Kubeconfigs, err = writeKubeconfigs(state, server, l.PKI.CACert, ids); err != nil {
		return layout{}, "", err
	}

	if l.TalosKubeconfig, err = writeTalosKubeconfig(state, server, o.ClusterName, l.PKI); errors.Is(err, errNoCAKey) {
		l.TalosKubeconfigError = fmt.Sprintf("%v: remove %s for a new cluster", err, state)
		os.Remove(filepath.Join(state, talosKubeconfigName)) //nolint:errcheck,gosec // none is the aim
	} else if err != nil {
		return layout{}, "", err
	}

	if o.KubeletProxy != "" {
		l.EgressConfig = filepath.Join(state, "egress-selector-config.yaml")
		if err := writeJSON(l.EgressConfig, egressSelectorConfiguration(o.KubeletProxy)); err != nil {
			return layout{}, "", err
		}
	}

	if err := writeJSON(l.AdmissionConfig, admissionConfiguration()); err != nil {
		return layout{}, "", err
	}

	return l, server, writeMark(state)
}

// credentials reads the PKI and tokens an earlier start wrote (resume), or writes new ones.
func credentials(resume bool, l *layout) ([]identity, error) {
	if resume {
		l.PKI = pkiPaths(l.PKIDir)

		return readIdentities(l.TokenFile)
	}

	var err error
	if l.PKI, err = writePKI(l.PKIDir); err != nil {
		return nil, err
	}

	ids, err := identities()
	if err != nil {
		return nil, err
	}

	return ids, writeTokenFile(l.TokenFile, ids)
}

// ready is the line printed (and written to DIR/simkube.json) once the control plane serves requests.
type ready struct {
	Server         string         `json:"server"`
	Kubeconfig     string         `json:"kubeconfig"`
	Pids           map[string]int `json:"pids"`
	Logs           string         `json:"logs"`
	StartupSeconds float64        `json:"startup_seconds"`
	// TalosKubeconfig is the admin kubeconfig with Talos's structure (a client certificate, admincert.go); ""
	// with TalosKubeconfigError saying why when the state directory has no CA key to sign one.
	TalosKubeconfig      string `json:"talos_kubeconfig"`
	TalosKubeconfigError string `json:"talos_kubeconfig_error,omitempty"`
}

// validate checks the components and their binaries before anything is written, so bad input leaves no
// half-made state directory behind.
func validate(o options) error {
	comps, err := components(o.Components, layout{}, ports{})
	if err != nil {
		return usageError{err.Error()}
	}

	for _, c := range comps {
		if info, statErr := os.Stat(filepath.Join(o.Bin, c.Name)); statErr != nil || info.IsDir() {
			return usageError{fmt.Sprintf("--bin %s has no %s binary (build it with tools/build-kube.sh)", o.Bin, c.Name)}
		}
	}

	return nil
}

func run(o options) error {
	started := time.Now()

	if err := validate(o); err != nil {
		return err
	}

	var saved endpoint
	if o.Resume {
		saved = readEndpoint(o.State)
	}

	p, kept, err := freePorts(saved.APIServerPort)
	if err != nil {
		return err
	}

	if saved.APIServerPort != 0 && !kept {
		fmt.Fprintf(os.Stderr, "simkube: port %d of the earlier start is taken: serving on %d (kubeconfigs saved "+
			"before name the old port; the service-account issuer stays %s)\n", saved.APIServerPort, p.APIServer, saved.Issuer)
	}

	l, server, err := prepare(o, p, saved.Issuer)
	if err != nil {
		return err
	}

	comps, err := components(o.Components, l, p)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	sup := &supervisor{bin: o.Bin, layout: l, ports: p}
	defer sup.stopAll()

	if err := sup.startAll(ctx, comps, server, o.Timeout); err != nil {
		return err
	}

	r := ready{Server: server, Kubeconfig: l.Kubeconfigs["admin"], Pids: sup.pids(), Logs: l.Logs,
		StartupSeconds: time.Since(started).Seconds(), TalosKubeconfig: l.TalosKubeconfig,
		TalosKubeconfigError: l.TalosKubeconfigError}

	line, err := json.Marshal(r)
	if err != nil {
		return err
	}

	if err := os.WriteFile(filepath.Join(l.State, "simkube.json"), append(line, '\n'), 0o600); err != nil {
		return err
	}

	fmt.Println(string(line))

	return sup.wait(ctx)
}

func main() {
	o, err := parseOptions(os.Args[1:])
	if err == nil {
		err = run(o)
	}

	var usage usageError

	switch {
	case err == nil:
	case errors.As(err, &usage):
		fmt.Fprintln(os.Stderr, "simkube:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "simkube:", err)
		os.Exit(1)
	}
}
