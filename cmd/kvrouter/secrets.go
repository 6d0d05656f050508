package main

import (
	"fmt"
	"os"
	"strings"
)

// secret is a token given by flag or by file (the file keeps it out of the
// process list and shell history): at most one of the two, the file's
// content trimmed of surrounding white space. Both empty is "" (no token).
func secret(name, value, fileFlag, file string) (string, error) {
	switch {
	case value != "" && file != "":
		return "", fmt.Errorf("--%s and --%s: give one of them", name, fileFlag)
	case file == "":
		return value, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", fileFlag, err)
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return "", fmt.Errorf("--%s: %s is empty", fileFlag, file)
	}
	return s, nil
}
