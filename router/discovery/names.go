package discovery

import (
	"strconv"
	"strings"
)

// Bounds on the names one instance may announce (service meta is written by
// whoever registers the service: untrusted).
const (
	maxServedNames = 64
	maxNameBytes   = 256
)

// namesOf reads an instance's further served names (MetaServedNames) and
// LoRA adapters (MetaLoRAAdapters) for its model: each list comma-separated,
// at most maxServedNames names of at most maxNameBytes printable bytes
// without white space, no name twice across model, names and adapters.
func namesOf(model string, get func(string) string) (names, adapters []string, err error) {
	seen := map[string]bool{model: true}
	if names, err = nameList(MetaServedNames, get(MetaServedNames), seen); err != nil {
		return nil, nil, err
	}
	if adapters, err = nameList(MetaLoRAAdapters, get(MetaLoRAAdapters), seen); err != nil {
		return nil, nil, err
	}
	return names, adapters, nil
}

func nameList(key, v string, seen map[string]bool) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	parts := strings.Split(v, ",")
	if len(parts) > maxServedNames {
		return nil, &MetaError{Key: key, Value: v, Reason: "more than " + strconv.Itoa(maxServedNames) + " names"}
	}
	out := make([]string, 0, len(parts))
	for _, n := range parts {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
			return nil, &MetaError{Key: key, Value: v, Reason: "an empty name"}
		case len(n) > maxNameBytes:
			return nil, &MetaError{Key: key, Value: v, Reason: "a name over " + strconv.Itoa(maxNameBytes) + " bytes"}
		case strings.ContainsFunc(n, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			return nil, &MetaError{Key: key, Value: v, Reason: "a name with white space or control characters"}
		case seen[n]:
			return nil, &MetaError{Key: key, Value: v, Reason: "name " + strconv.Quote(n) + " listed twice (or the model's own)"}
		}
		seen[n] = true
		out = append(out, n)
	}
	return out, nil
}
