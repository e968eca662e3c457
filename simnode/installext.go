package main

import (
	"fmt"
	"slices"
	"strings"
)

// machine.install.extensions: before the Image Factory (Talos 1.3 and 1.4) this is how system extensions reach a
// node. The upgrade task runs the installer with the running config (talos@v1.4.8:internal/app/machined/pkg/runtime/
// v1alpha1/v1alpha1_sequencer_tasks.go:1926-1934, r.Config()); RunInstallerContainer reads the config's
// machine.install.extensions and pulls and mounts each image, in order, beside the installer's own
// (talos@v1.4.8:internal/pkg/install/install.go:59,103; v1.3.7:58,102; still at v1.9.0:62,104; v1.10.0's
// install.go no longer reads the field). The first image that does not pull fails the task with image.Pull's
// wrapping, "failed to pull image %q: %w" (talos@v1.4.8:internal/pkg/extensions/pull.go:63-66,
// internal/pkg/containers/image/image.go:90). What the installer image itself installs (a 1.3/1.4 stock installer:
// nothing) comes first.

// pullsConfigExtensions: the running release's machined pulls the listed images (up to 1.9). Whether a 1.10 or
// later installer keeps what a 1.9 machined mounted for it is not known here (runbook_lib/model/upgrade_risks.py
// config_installed_extensions counts nothing then), so they are installed only when both are before 1.10.
func pullsConfigExtensions(running, installer string) bool {
	return !atLeast(running, 1, 10) && !atLeast(installer, 1, 10)
}

// configExtensions are the extensions the installer run for image adds from the active config: nil when the
// config lists none or the releases do not pull them; the error is the upgrade task's.
func (n *simNode) configExtensions(image string) ([]ExtensionSpec, error) {
	cfg := n.activeConfig()
	if cfg == nil || cfg.Machine() == nil || len(cfg.Machine().Install().Extensions()) == 0 {
		return nil, nil
	}

	img, err := n.image(image)
	if err != nil || !pullsConfigExtensions(n.bootState().version, img.TalosVersion) {
		return nil, nil //nolint:nilerr // the installer lookup failed at the call already; nothing more to install
	}

	var out []ExtensionSpec

	for i, ext := range cfg.Machine().Install().Extensions() {
		spec, err := n.catalog.lookupExtension(ext.Image())
		if err != nil {
			return nil, fmt.Errorf("failed to pull image %q: %w", ext.Image(), err)
		}

		spec.Image = pulledName(i, ext.Image()) + ".sqsh"
		out = append(out, spec)
	}

	return out, nil
}

// pulledName is the name PullAndMount mounts the i-th listed image under: a numeric prefix keeping them in order,
// then the reference with ':' and '/' as '-' (talos@v1.4.8 internal/pkg/extensions/pull.go:57). The
// ExtensionStatus image is taken to be that name plus ".sqsh", as an Image Factory installer's layers are named
// (tests/sim/test_real_talos_13_16.py nvidia_image); a capture of a 1.3/1.4 node's would settle it.
func pulledName(i int, ref string) string {
	return fmt.Sprintf("%03d.%s", i, strings.ReplaceAll(strings.ReplaceAll(ref, ":", "-"), "/", "-"))
}

// withConfigExtensions is img with the extensions a machine.install.extensions install added: after the image's
// own, before Image Factory's virtual "schematic" extension (which the nodes file lists last).
func withConfigExtensions(img ImageSpec, extras []ExtensionSpec) ImageSpec {
	if len(extras) == 0 {
		return img
	}

	own := slices.Clone(img.Extensions)
	at := slices.IndexFunc(own, func(e ExtensionSpec) bool { return e.Name == "schematic" })

	if at < 0 {
		at = len(own)
	}

	return ImageSpec{TalosVersion: img.TalosVersion, Extensions: slices.Insert(own, at, extras...)}
}

// bootExtensions are the machine.install.extensions installs of the boot into image that powerOn starts, chosen
// as bootArgs chooses the kernel arguments (pickForBoot).
func (n *simNode) bootExtensions(image, previous string) []ExtensionSpec {
	b := n.boot // powerOn holds n.mu

	return pickForBoot(b, image, previous, b.exts, b.previousExts, b.installedExts)
}
