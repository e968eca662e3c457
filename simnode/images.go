package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// imageCatalog answers "what does this installer image install": the nodes file's "images" first, then, with
// -image-resolver, the resolver program (run once per unknown reference; its answers are kept). The runbook's
// simulated cluster resolves through its Image Factory room, whose schematic IDs are only known once the runbook
// registers a schematic, so they cannot be listed in the nodes file beforehand. Shared by every node: safe for
// concurrent use.
type imageCatalog struct {
	static   map[string]ImageSpec
	resolver string // executable: argv [resolver, ref] -> ImageSpec JSON on stdout, or exit != 0 with a message

	mu         sync.Mutex
	resolved   map[string]ImageSpec
	extensions map[string]ExtensionSpec // extension images the resolver answered (lookupExtension)
}

func newImageCatalog(static map[string]ImageSpec, resolver string) *imageCatalog {
	return &imageCatalog{static: static, resolver: resolver, resolved: map[string]ImageSpec{}, extensions: map[string]ExtensionSpec{}}
}

// resolveTimeout bounds one resolver run (ours): an upgrade request must not hang on it.
const resolveTimeout = 30 * time.Second

// lookup returns what ref installs; the error is the reason it cannot be pulled (the caller wraps it as
// machined wraps an image validation failure).
func (c *imageCatalog) lookup(ref string) (ImageSpec, error) {
	if img, ok := c.static[ref]; ok {
		return img, nil
	}

	if c.resolver == "" {
		return ImageSpec{}, fmt.Errorf("simnode: not one of the nodes file's \"images\" %v", sortedKeys(c.static))
	}

	c.mu.Lock()
	defer c.mu.Unlock()

	if img, ok := c.resolved[ref]; ok {
		return img, nil
	}

	out, err := c.run(ref)
	if err != nil {
		return ImageSpec{}, err
	}

	var img ImageSpec
	if err = json.Unmarshal(out, &img); err != nil || !strings.HasPrefix(img.TalosVersion, "v") {
		return ImageSpec{}, fmt.Errorf("simnode: image resolver %s answered no image for %q (%v): %q", c.resolver, ref, err, out)
	}

	c.resolved[ref] = img

	return img, nil
}

// lookupExtension is what the system extension image ref (a machine.install.extensions entry, installext.go)
// installs, asked of the resolver as "--extension ref"; the error is why it cannot be pulled.
func (c *imageCatalog) lookupExtension(ref string) (ExtensionSpec, error) {
	if c.resolver == "" {
		return ExtensionSpec{}, fmt.Errorf("simnode: no -image-resolver to pull extension image %q from", ref)
	}

	c.mu.Lock()
	defer c.mu.Unlock()

	if ext, ok := c.extensions[ref]; ok {
		return ext, nil
	}

	out, err := c.run("--extension", ref)
	if err != nil {
		return ExtensionSpec{}, err
	}

	var ext ExtensionSpec
	if err = json.Unmarshal(out, &ext); err != nil || ext.Name == "" {
		return ExtensionSpec{}, fmt.Errorf("simnode: image resolver %s answered no extension for %q (%v): %q", c.resolver, ref, err, out)
	}

	c.extensions[ref] = ext

	return ext, nil
}

// run asks the resolver (argv: args) and returns its stdout, or its stderr as the error.
func (c *imageCatalog) run(args ...string) ([]byte, error) {
	cmd := exec.Command(c.resolver, args...)
	cmd.WaitDelay = resolveTimeout

	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr

	timer := time.AfterFunc(resolveTimeout, func() {
		if cmd.Process != nil {
			cmd.Process.Kill() //nolint:errcheck // best effort: Wait reports the outcome
		}
	})
	defer timer.Stop()

	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}

		return nil, errors.New(msg)
	}

	return stdout.Bytes(), nil
}
