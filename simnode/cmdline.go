package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config"
)

// cmdlinePath is the kernel command line, which the runbook reads to check what GRUB booted after an upgrade.
const cmdlinePath = "/proc/cmdline"

// talosCmdline is the command line's fixed part, the same text as the Python talosctl's (runbook_lib/sim/state.py
// TALOS_CMDLINE; ours, not read from a node): a real node's depends on its platform and image.
const talosCmdline = "console=tty0 init_on_alloc=1 slab_nomerge pti=on consoleblank=0 nvme_core.io_timeout=4294967295 " +
	"printk.devkmsg=on ima_template=ima-ng ima_appraise=fix ima_hash=sha512"

// cmdline is /proc/cmdline: the platform, the fixed part, then the extra arguments this boot's GRUB entry has.
func (n *simNode) cmdline() string {
	platform := ""
	if n.spec.PlatformMetadata != nil {
		platform = n.spec.PlatformMetadata.Platform
	}

	words := append([]string{"talos.platform=" + platform, talosCmdline}, n.bootState().args...)

	return fmt.Sprintf("%s\n", strings.Join(words, " "))
}

// installArgs are the extra kernel arguments an installer run through the legacy upgrade API (or the first
// install) writes into GRUB's entry: machine.install.extraKernelArgs, unless grubUseUKICmdline makes the command
// line the UKI's (Talos refuses both together: talos@v1.13.0 pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go:114).
func installArgs(cfg config.Provider) []string {
	if cfg == nil || cfg.Machine() == nil || cfg.Machine().Install().GrubUseUKICmdline() {
		return nil
	}

	return slices.Clone(cfg.Machine().Install().ExtraKernelArgs())
}

// install records what an installer run writes for the next boot: args into GRUB's entry, exts beside the
// installer's own (installext.go).
func (n *simNode) install(args []string, exts []ExtensionSpec) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.boot.installed, n.boot.installedArgs, n.boot.installedExts = true, args, exts
}

// bootArgs are the extra kernel arguments of the boot into image that powerOn starts: the previous boot's for
// a rollback (powerOn with no image to return to), what the last installer wrote (install): the config's through
// the legacy upgrade API, none through LifecycleService.Upgrade (talosctl 1.13's new upgrade API does not pass
// extraKernelArgs, so GRUB boots without them and nothing reports it: siderolabs/docs public/talos/v1.13/
// configure-your-talos-cluster/lifecycle-management/upgrading-talos.mdx:121-137, as runbook_lib/sim/state.py
// kernel_args_after_upgrade; derived from the docs, not observed), else the same ones (a reboot).
func (n *simNode) bootArgs(image, previous string) []string {
	b := n.boot // powerOn holds n.mu

	return pickForBoot(b, image, previous, b.args, b.previousArgs, b.installedArgs)
}

// pickForBoot is what the boot into image (powerOn's arguments) starts with, of three records kept as b's
// kernel arguments are: previous's for a rollback (no image to return to: the boot before this one's),
// installed's when an installer ran since this boot, else current's (a reboot).
func pickForBoot[T any](b bootInfo, image, previous string, current, prev, installed T) T {
	switch {
	case previous == "" && image == b.previous && image != b.image:
		return prev
	case b.installed:
		return installed
	default:
		return current
	}
}
