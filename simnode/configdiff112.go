package main

import (
	"fmt"
	"strings"

	"github.com/hexops/gotextdiff"
	"github.com/hexops/gotextdiff/myers"
	"github.com/hexops/gotextdiff/span"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configdiff"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
)

// configDiff is the diff a node's machined prints for an apply (dry run, or a change that cannot apply
// immediately): Talos 1.13 moved to configdiff.DiffConfigs (pkg/machinery/textdiff), earlier releases print
// gotextdiff's unified diff (diff112). simnode is built on pkg/machinery v1.13, so it keeps the older one for
// nodes running an older release.
func configDiff(tag string, oldCfg, newCfg config.Encoder) (string, error) {
	if hasLifecycleAPI(tag) {
		return configdiff.DiffConfigs(oldCfg, newCfg)
	}

	return diff112(oldCfg, newCfg, atLeast(tag, 1, 10))
}

// diff112 is talos@v1.12.0:pkg/machinery/config/configdiff/configdiff.go DiffToString (Diff, then outputDiff with
// noColor), rewritten here because pkg/machinery v1.13 no longer has it (MPL-2.0, Sidero Labs).
//
// Before 1.10 the hunk header's closing " @@\n" went to machined's stdout (cyan.Printf, not Fprintf to the diff:
// talos@v1.9.0:pkg/machinery/config/configdiff/configdiff.go:112, fixed by talos commit f35b58779 "fix: fix diff
// printing", first in v1.10.0), so a 1.9 node's header runs on into the hunk's first line: closeHeader false.
func diff112(oldCfg, newCfg config.Encoder, closeHeader bool) (string, error) {
	var oldYAML, newYAML []byte

	for _, c := range []struct {
		cfg config.Encoder
		out *[]byte
	}{{oldCfg, &oldYAML}, {newCfg, &newYAML}} {
		if c.cfg == nil {
			continue
		}

		b, err := c.cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
		if err != nil {
			return "", err
		}

		*c.out = b
	}

	edits := myers.ComputeEdits(span.URIFromPath("a"), string(oldYAML), string(newYAML))
	u := gotextdiff.ToUnified("a", "b", string(oldYAML), edits)

	if len(u.Hunks) == 0 {
		return "", nil
	}

	var sb strings.Builder

	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", u.From, u.To)

	for _, hunk := range u.Hunks {
		writeHunk112(&sb, hunk, closeHeader)
	}

	return sb.String(), nil
}

// writeHunk112 is outputDiff's loop body (configdiff.go:86-130 at v1.12.0): a count of 1 is left out of the header.
func writeHunk112(sb *strings.Builder, hunk *gotextdiff.Hunk, closeHeader bool) {
	fromCount, toCount := 0, 0

	for _, l := range hunk.Lines {
		switch l.Kind { //nolint:exhaustive
		case gotextdiff.Delete:
			fromCount++
		case gotextdiff.Insert:
			toCount++
		default:
			fromCount++
			toCount++
		}
	}

	sb.WriteString("@@")

	if fromCount > 1 {
		fmt.Fprintf(sb, " -%d,%d", hunk.FromLine, fromCount)
	} else {
		fmt.Fprintf(sb, " -%d", hunk.FromLine)
	}

	if toCount > 1 {
		fmt.Fprintf(sb, " +%d,%d", hunk.ToLine, toCount)
	} else {
		fmt.Fprintf(sb, " +%d", hunk.ToLine)
	}

	if closeHeader {
		sb.WriteString(" @@\n")
	}

	for _, l := range hunk.Lines {
		switch l.Kind { //nolint:exhaustive
		case gotextdiff.Delete:
			fmt.Fprintf(sb, "-%s", l.Content)
		case gotextdiff.Insert:
			fmt.Fprintf(sb, "+%s", l.Content)
		default:
			fmt.Fprintf(sb, " %s", l.Content)
		}

		if !strings.HasSuffix(l.Content, "\n") {
			sb.WriteString("\n\\ No newline at end of file\n")
		}
	}
}
