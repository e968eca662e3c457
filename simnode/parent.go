package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"
)

// parentPoll is how often simnode checks that the process it follows (-parent-pid) still runs.
const parentPoll = 500 * time.Millisecond

// processStart is the start time of a live process in clock ticks since boot (/proc/<pid>/stat field 22),
// "" when there is no such process or it is a zombie (it has exited). The same reading as the Python
// simulator's pidfile.start_time, so a start time recorded there matches this one.
func processStart(pid int) string {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// comm (field 2) is in parentheses and may hold spaces or ')': the fields after it follow the last ')'.
	text := string(stat)

	end := strings.LastIndexByte(text, ')')
	if end < 0 || end+2 > len(text) {
		return ""
	}

	fields := strings.Fields(text[end+2:])
	if len(fields) < 20 || fields[0] == "Z" {
		return ""
	}

	return fields[19]
}

// parentFlags checks -parent-pid and -parent-start: both or neither, the pid positive, the start time
// digits (the form processStart reads).
func parentFlags(pid int, start string) error {
	if pid == 0 && start == "" {
		return nil
	}

	if pid <= 0 {
		return fmt.Errorf("%w: -parent-pid %d must be a positive pid (with -parent-start)", errUsage, pid)
	}

	if _, err := strconv.ParseUint(start, 10, 64); err != nil {
		return fmt.Errorf("%w: -parent-start %q must be the start time of -parent-pid in clock ticks "+
			"(/proc/<pid>/stat field 22)", errUsage, start)
	}

	return nil
}

// followParent returns a context cancelled when the process -parent-pid/-parent-start names is gone (exited,
// killed, or its pid reused by another process: the start time differs), so simnode never outlives the
// simulator daemon that owns its nodes (the Python simulator's realkube supervisor follows the daemon the
// same way). With no parent it returns ctx as it is; a parent already gone is an error.
func followParent(ctx context.Context, pid int, start string) (context.Context, error) {
	if pid == 0 {
		return ctx, nil
	}

	if processStart(pid) != start {
		return nil, fmt.Errorf("%w: -parent-pid %d with start time %s is not running", errUsage, pid, start)
	}

	child, cancel := context.WithCancel(ctx)

	go func() {
		ticker := time.NewTicker(parentPoll)
		defer ticker.Stop()

		for {
			select {
			case <-child.Done():
				return
			case <-ticker.C:
				if processStart(pid) != start {
					log.Printf("parent process %d is gone: stopping", pid)
					cancel()

					return
				}
			}
		}
	}()

	return child, nil
}
