package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// freePorts asks the kernel for three free loopback ports, the API server's on apiPort when that is not 0 and
// still free (a restart serves where the earlier start did, see endpoint; probed first, so the others cannot take
// it); kept tells whether it was. Another process could take one before the component binds it; the component
// then fails to start and its log says so.
func freePorts(apiPort int) (ports, bool, error) {
	var got []int

	for _, want := range []int{apiPort, 0, 0} {
		l, err := probe(want)
		if err != nil {
			return ports{}, false, err
		}

		defer l.Close() //nolint:errcheck // closing a probe listener

		got = append(got, l.Addr().(*net.TCPAddr).Port)
	}

	return ports{APIServer: got[0], EtcdClient: got[1], EtcdPeer: got[2]}, apiPort != 0 && got[0] == apiPort, nil
}

// probe listens on 127.0.0.1:port, or on a port the kernel picks when port is 0 or taken (serving elsewhere
// beats not serving at all).
func probe(port int) (net.Listener, error) {
	if port != 0 {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			return l, nil
		}
	}

	return net.Listen("tcp", "127.0.0.1:0")
}

type running struct {
	name string
	cmd  *exec.Cmd
	done chan error
}

// supervisor starts the components in order and stops them in reverse order.
type supervisor struct {
	bin     string
	layout  layout
	ports   ports
	running []*running
}

func (s *supervisor) start(c component) error {
	logFile, err := os.OpenFile(logPath(s.layout, c.Name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}

	cmd := exec.Command(filepath.Join(s.bin, c.Name), c.Args...) //nolint:gosec // binaries from --bin
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = s.layout.State
	// Children die with simkube even on SIGKILL, so a crashed supervisor leaves nothing running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	if err := cmd.Start(); err != nil {
		logFile.Close() //nolint:errcheck,gosec // start failed

		return fmt.Errorf("start %s: %w", c.Name, err)
	}

	r := &running{name: c.Name, cmd: cmd, done: make(chan error, 1)}
	go func() { r.done <- cmd.Wait(); logFile.Close() }() //nolint:errcheck,gosec // log closed after exit

	s.running = append(s.running, r)

	return nil
}

func (s *supervisor) startAll(ctx context.Context, comps []component, server string, timeout time.Duration) error {
	for _, c := range comps {
		if err := s.start(c); err != nil {
			return err
		}

		if err := s.waitReady(ctx, c, server, timeout); err != nil {
			return fmt.Errorf("%s did not become ready: %w (log: %s)\n%s", c.Name, err,
				logPath(s.layout, c.Name), tail(logPath(s.layout, c.Name), 15))
		}
	}

	return nil
}

// waitReady polls etcd's /health and kube-apiserver's /readyz; the controller-manager and scheduler serve
// no port here, so they count as ready once they have run for a second without exiting.
func (s *supervisor) waitReady(ctx context.Context, c component, server string, timeout time.Duration) error {
	r := s.running[len(s.running)-1]
	deadline := time.Now().Add(timeout)
	probe := s.probe(c.Name, server)

	for {
		select {
		case err := <-r.done:
			r.done <- err

			return fmt.Errorf("exited: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}

		if probe == nil {
			if time.Until(deadline) < timeout-time.Second {
				return nil
			}

			continue
		}

		if err := probe(); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return err
		}
	}
}

func (s *supervisor) probe(name, server string) func() error {
	switch name {
	case "etcd":
		return func() error {
			return get(http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/health", s.ports.EtcdClient), "")
		}
	case "kube-apiserver":
		client, token := s.adminClient()

		return func() error { return get(client, server+"/readyz", token) }
	default:
		return nil
	}
}

func get(client *http.Client, url, token string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}

	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}

	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close() //nolint:errcheck // probe

	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
	}

	return nil
}

// adminClient trusts the generated CA and reads the admin token back from the token file.
func (s *supervisor) adminClient() (*http.Client, string) {
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(s.layout.PKI.CACert); err == nil {
		pool.AppendCertsFromPEM(pem)
	}

	token := ""
	if data, err := os.ReadFile(s.layout.TokenFile); err == nil {
		token, _, _ = strings.Cut(string(data), ",")
	}

	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}, token
}

func (s *supervisor) pids() map[string]int {
	out := map[string]int{}
	for _, r := range s.running {
		out[r.name] = r.cmd.Process.Pid
	}

	return out
}

// wait returns nil when asked to stop, an error naming the component when one exits on its own.
func (s *supervisor) wait(ctx context.Context) error {
	exited := make(chan string, len(s.running))

	for _, r := range s.running {
		go func(r *running) {
			select {
			case err := <-r.done:
				r.done <- err
				exited <- fmt.Sprintf("%s exited: %v (log: %s)", r.name, err, logPath(s.layout, r.name))
			case <-ctx.Done():
			}
		}(r)
	}

	select {
	case <-ctx.Done():
		return nil
	case msg := <-exited:
		return errors.New(msg)
	}
}

// stopAll sends SIGTERM in reverse start order and SIGKILL after 10 s.
func (s *supervisor) stopAll() {
	for i := len(s.running) - 1; i >= 0; i-- {
		r := s.running[i]
		_ = r.cmd.Process.Signal(syscall.SIGTERM)

		select {
		case err := <-r.done:
			r.done <- err
		case <-time.After(10 * time.Second):
			_ = r.cmd.Process.Kill()
			<-r.done
		}
	}

	s.running = nil
}

// tail returns the last n lines of a log, for the error message of a failed start.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}

	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}

	return string(bytes.Join(lines, []byte("\n")))
}
