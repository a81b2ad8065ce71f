package discovery

import (
	"strconv"
	"strings"

	"github.com/oasis-llm/oasis/router/worker"
)

// Bounds on the names one instance may announce (service meta is written by
// whoever registers the service: untrusted).
const (
	maxServedNames = 64
	maxNameBytes   = 256
)

// namesOf reads an instance's further served names (MetaServedNames), LoRA
// adapters (MetaLoRAAdapters) and adapters it can load (MetaLoRALoadable,
// name=path) for its model: each list comma-separated, at most
// maxServedNames names of at most maxNameBytes printable bytes without
// white space, no name twice across model and the lists, a path likewise.
func namesOf(model string, get func(string) string) (names, adapters []string, loadable []worker.LoRA, err error) {
	seen := map[string]bool{model: true}
	if names, err = nameList(MetaServedNames, get(MetaServedNames), seen); err != nil {
		return nil, nil, nil, err
	}
	if adapters, err = nameList(MetaLoRAAdapters, get(MetaLoRAAdapters), seen); err != nil {
		return nil, nil, nil, err
	}
	v := get(MetaLoRALoadable)
	if v == "" {
		return names, adapters, nil, nil
	}
	var paths []string
	var pairs []string
	for _, e := range strings.Split(v, ",") {
		name, path, ok := strings.Cut(strings.TrimSpace(e), "=")
		if !ok || path == "" {
			return nil, nil, nil, &MetaError{Key: MetaLoRALoadable, Value: v, Reason: "an entry without name=path"}
		}
		pairs, paths = append(pairs, name), append(paths, path)
	}
	if _, err = nameList(MetaLoRALoadable, strings.Join(pairs, ","), seen); err != nil {
		return nil, nil, nil, err
	}
	if _, err = nameList(MetaLoRALoadable, strings.Join(paths, ","), map[string]bool{}); err != nil {
		return nil, nil, nil, err
	}
	for i := range pairs {
		loadable = append(loadable, worker.LoRA{Name: pairs[i], Path: paths[i]})
	}
	return names, adapters, loadable, nil
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
