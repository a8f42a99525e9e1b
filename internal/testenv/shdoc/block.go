package shdoc

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Block returns the commands of the first ```sh block after the markdown heading (the
// heading's text, without the #s) in the file at path. A command is one line, or several
// when a line ends in a backslash or a for, while, until, if or case opens a body that a
// later line closes; comment-only lines are dropped.
func Block(path, heading string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		lines              []string
		underHeading, inSh bool
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case !inSh && strings.HasPrefix(trimmed, "#") && strings.TrimSpace(strings.TrimLeft(trimmed, "#")) == heading:
			underHeading = true
		case underHeading && !inSh && trimmed == "```sh":
			inSh = true
		case inSh && trimmed == "```":
			return join(lines)
		case inSh:
			lines = append(lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !underHeading {
		return nil, fmt.Errorf("%s: no heading %q", path, heading)
	}
	return nil, fmt.Errorf("%s: no closed ```sh block under %q", path, heading)
}

var (
	opens  = regexp.MustCompile(`^\s*(for|while|until|if|case)\b`)
	closes = regexp.MustCompile(`^\s*(done|fi|esac)\b`)
)

// join makes commands of lines: continuations and compound commands become one.
func join(lines []string) ([]string, error) {
	var (
		cmds  []string
		cur   []string
		depth int
	)
	for _, line := range lines {
		trimmed := strings.TrimSpace(line)
		if len(cur) == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue // a comment of its own: no command (also a comment below one)
		}
		cur = append(cur, line)
		code := stripComment(trimmed)
		if opens.MatchString(code) && !strings.Contains(code, "done") && !strings.Contains(code, " fi") {
			depth++
		}
		if closes.MatchString(code) {
			depth--
		}
		if depth > 0 || strings.HasSuffix(code, `\`) {
			continue
		}
		cmds = append(cmds, strings.Join(cur, "\n"))
		cur = nil
	}
	if len(cur) > 0 {
		return nil, fmt.Errorf("unterminated command: %s", strings.Join(cur, "\n"))
	}
	return cmds, nil
}

// Code is a one-line command without its trailing comment, as the shell reads it.
func Code(command string) string { return stripComment(strings.TrimSpace(command)) }

// stripComment drops a trailing comment: a # after white space, outside quotes.
func stripComment(s string) string {
	var quote rune
	for i, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t'):
			return strings.TrimSpace(s[:i])
		}
	}
	return s
}
