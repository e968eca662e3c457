package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// identity is one bearer-token user of the control plane: the admin the kubeconfig is written for, and the
// controller-manager and scheduler, whose user names are the ones RBAC's bootstrap policy binds.
type identity struct {
	Name, User, Group, Token string
}

// admissionConfiguration is what Talos v1.12.0 writes to admission-control-config.yaml by default:
// the PodSecurity plugin enforcing "baseline" and auditing/warning "restricted", kube-system exempt.
// Source: siderolabs/talos@v1.12.0 pkg/machinery/config/generate/init.go (AdmissionControlConfig, enabled by
// VersionContract.PodSecurityAdmissionEnabled for Talos > 1.0) rendered as an apiserver.config.k8s.io/v1
// AdmissionConfiguration by internal/app/machined/pkg/controllers/k8s/render_config_static_pods.go
// (admissionControlConfig).
func admissionConfiguration() map[string]any {
	return map[string]any{
		"apiVersion": "apiserver.config.k8s.io/v1",
		"kind":       "AdmissionConfiguration",
		"plugins": []any{map[string]any{
			"name": "PodSecurity",
			"configuration": map[string]any{
				"apiVersion": "pod-security.admission.config.k8s.io/v1alpha1",
				"kind":       "PodSecurityConfiguration",
				"defaults": map[string]any{
					"enforce": "baseline", "enforce-version": "latest",
					"audit": "restricted", "audit-version": "latest",
					"warn": "restricted", "warn-version": "latest",
				},
				"exemptions": map[string]any{
					"usernames": []any{}, "runtimeClasses": []any{}, "namespaces": []any{"kube-system"},
				},
			},
		}},
	}
}

// writeJSON writes v as JSON (valid YAML, which every consumer here accepts) with mode 0600.
func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}

	return os.WriteFile(path, append(data, '\n'), 0o600)
}

// writeTokenFile writes the --token-auth-file CSV: token,user,uid,"group".
func writeTokenFile(path string, ids []identity) error {
	var b strings.Builder

	for _, id := range ids {
		fmt.Fprintf(&b, "%s,%s,%s", id.Token, id.User, id.User)

		if id.Group != "" {
			fmt.Fprintf(&b, ",%q", id.Group)
		}

		b.WriteString("\n")
	}

	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// kubeconfig is a client configuration with one cluster, one bearer-token user and one context, named
// after the identity (admin: "simkube", as the admin kubeconfig a user is given).
func kubeconfig(server, caFile string, id identity) map[string]any {
	name := "simkube"
	if id.Name != "admin" {
		name = id.Name
	}

	return map[string]any{
		"apiVersion":      "v1",
		"kind":            "Config",
		"clusters":        []any{map[string]any{"name": "simkube", "cluster": map[string]any{"server": server, "certificate-authority": caFile}}},
		"users":           []any{map[string]any{"name": name, "user": map[string]any{"token": id.Token}}},
		"contexts":        []any{map[string]any{"name": name, "context": map[string]any{"cluster": "simkube", "user": name}}},
		"current-context": name,
	}
}

// writeKubeconfigs writes <dir>/<identity>.kubeconfig for each identity and returns their paths by name.
func writeKubeconfigs(dir, server, caFile string, ids []identity) (map[string]string, error) {
	paths := map[string]string{}

	for _, id := range ids {
		path := filepath.Join(dir, id.Name+".kubeconfig")
		if err := writeJSON(path, kubeconfig(server, caFile, id)); err != nil {
			return nil, err
		}

		paths[id.Name] = path
	}

	return paths, nil
}

// baseIdentities are the admin, the controller-manager and the scheduler, without their tokens.
func baseIdentities() []identity {
	return []identity{
		{Name: "admin", User: "admin", Group: "system:masters"},
		{Name: "kube-controller-manager", User: "system:kube-controller-manager"},
		{Name: "kube-scheduler", User: "system:kube-scheduler"},
	}
}

// identities creates a fresh token for the admin, the controller-manager and the scheduler.
func identities() ([]identity, error) {
	ids := baseIdentities()

	for i := range ids {
		token, err := newToken()
		if err != nil {
			return nil, err
		}

		ids[i].Token = token
	}

	return ids, nil
}

// egressSelectorConfiguration sends the API server's "cluster" egress (kubelets, pods, services) through an
// HTTP CONNECT proxy on a unix socket (k8s.io/apiserver@v0.35.0 pkg/apis/apiserver: EgressSelectorConfiguration
// v1beta1; pkg/server/egressselector/egress_selector.go connectionToDialerCreator: a TCP transport is always
// TLS, a UDS one is plain, which is what a proxy inside the simulator's private state directory needs).
func egressSelectorConfiguration(socket string) map[string]any {
	return map[string]any{
		"apiVersion": "apiserver.k8s.io/v1beta1",
		"kind":       "EgressSelectorConfiguration",
		"egressSelections": []any{map[string]any{
			"name": "cluster",
			"connection": map[string]any{
				"proxyProtocol": "HTTPConnect",
				"transport":     map[string]any{"uds": map[string]any{"udsName": socket}},
			},
		}},
	}
}
