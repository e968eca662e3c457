package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// stateMark is written last, once a first start has written every file a restart reuses. Why a mark: a real
// cluster's control plane keeps its etcd, certificates and keys across restarts, so a restarted simkube must
// resume a state directory, but only one it finished writing: a directory with files and no mark is another
// program's or a start that died half-way, and resuming either would fail later with a confusing error.
const stateMark = "simkube-state.json"

// stateFormat is the layout version in the mark; a mark of another version is refused rather than guessed at.
const stateFormat = 1

type mark struct {
	Format int `json:"simkube_state_format"`
}

// resumable tells a new state directory (absent or empty: false) from one a finished earlier start left (true),
// and refuses anything else with a usage error naming the directory and what would be valid.
func resumable(dir string) (bool, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(entries) == 0) {
		return false, nil
	}

	if err != nil {
		return false, usageError{fmt.Sprintf("--state %s: %v", dir, err)}
	}

	refuse := func(why string) error {
		return usageError{fmt.Sprintf("--state %s is not empty and %s: give a new (or empty) directory, or the "+
			"directory of an earlier simkube to resume it", dir, why)}
	}

	data, err := os.ReadFile(filepath.Join(dir, stateMark))
	if err != nil {
		return false, refuse(fmt.Sprintf("has no %s (not simkube's, or its first start did not finish)", stateMark))
	}

	var m mark
	if json.Unmarshal(data, &m) != nil || m.Format != stateFormat {
		return false, refuse(fmt.Sprintf("its %s is not simkube state format %d", stateMark, stateFormat))
	}

	for _, f := range append(pkiPaths(filepath.Join(dir, "pki")).files(), filepath.Join(dir, "pki", "tokens.csv")) {
		if _, err := os.Stat(f); err != nil {
			return false, refuse(fmt.Sprintf("lacks %s, which %s says was written", f, stateMark))
		}
	}

	return true, nil
}

// writeMark records that the directory holds everything a restart reuses (written atomically, last).
func writeMark(dir string) error {
	tmp := filepath.Join(dir, stateMark+".tmp")
	if err := writeJSON(tmp, mark{Format: stateFormat}); err != nil {
		return err
	}

	return os.Rename(tmp, filepath.Join(dir, stateMark))
}

// readIdentities reads the tokens of the admin, controller-manager and scheduler back from the token file an
// earlier start wrote (token,user,uid[,"group"]), so kubeconfigs handed out before a restart keep working.
func readIdentities(path string) ([]identity, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}

	tokens := map[string]string{}

	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		fields := strings.Split(line, ",")
		if len(fields) >= 2 {
			tokens[fields[1]] = fields[0]
		}
	}

	ids := baseIdentities()
	for i := range ids {
		if ids[i].Token = tokens[ids[i].User]; ids[i].Token == "" {
			return nil, usageError{fmt.Sprintf("%s has no token for %s: remove the state directory", path, ids[i].User)}
		}
	}

	return ids, nil
}

// endpointFile keeps the API server's port and service-account issuer across restarts. Why: a Talos cluster's
// API endpoint and issuer come from its machine config (cluster.controlPlane.endpoint; Talos sets
// --service-account-issuer and --api-audiences to it: siderolabs/talos@v1.12.0
// internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go, manageAPIServer), so they stay the same
// when the control plane restarts, and a kubeconfig saved earlier keeps working.
const endpointFile = "endpoint.json"

type endpoint struct {
	APIServerPort int    `json:"apiserver_port"`
	Issuer        string `json:"service_account_issuer"`
}

// readEndpoint returns the endpoint an earlier start of dir served, or the zero endpoint when there is none (a
// new directory, or one written before simkube kept its endpoint: a new port is picked then).
func readEndpoint(dir string) endpoint {
	var e endpoint

	data, err := os.ReadFile(filepath.Join(dir, endpointFile))
	if err != nil || json.Unmarshal(data, &e) != nil || e.APIServerPort <= 0 || e.APIServerPort > 65535 {
		return endpoint{}
	}

	return e
}
