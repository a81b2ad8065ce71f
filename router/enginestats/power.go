package enginestats

import (
	"strings"

	nomadapi "github.com/hashicorp/nomad/api"
)

// NodePowerWatts sums the GPU power draw of every device instance in a Nomad
// node's stats (GET /v1/client/stats?node_id=…, DeviceStats). A device plugin
// reports power as a stat attribute whose name contains "power" and whose unit
// is W or mW (nomad-device-nvidia: "Power usage", "W"); limits and energy
// counters are skipped. ok is false when no device reports power.
func NodePowerWatts(hs *nomadapi.HostStats) (watts float64, ok bool) {
	if hs == nil {
		return 0, false
	}
	for _, g := range hs.DeviceStats {
		if g == nil {
			continue
		}
		for _, inst := range g.InstanceStats {
			if inst == nil {
				continue
			}
			if w, found := powerIn(inst.Stats); found {
				watts += w
				ok = true
			}
		}
	}
	return watts, ok
}

// NodeEnergyJoules sums the devices' cumulative energy counters ("Energy" in
// J, or mJ) in a node's stats. ok is false when any device with stats lacks
// one, since a partial sum would read as a drop in power.
func NodeEnergyJoules(hs *nomadapi.HostStats) (joules float64, ok bool) {
	if hs == nil {
		return 0, false
	}
	for _, g := range hs.DeviceStats {
		if g == nil {
			continue
		}
		for _, inst := range g.InstanceStats {
			if inst == nil || inst.Stats == nil {
				continue
			}
			v := inst.Stats.Attributes["Energy"]
			if v == nil || v.FloatNumeratorVal == nil && v.IntNumeratorVal == nil {
				return 0, false
			}
			x := 0.0
			if v.FloatNumeratorVal != nil {
				x = *v.FloatNumeratorVal
			} else {
				x = float64(*v.IntNumeratorVal)
			}
			switch v.Unit {
			case "J":
			case "mJ":
				x /= 1000
			default:
				return 0, false
			}
			joules += x
			ok = true
		}
	}
	return joules, ok
}

// powerIn finds the power-draw attribute in a stats tree: Oasis's
// nomad-device-gpu "Power draw", nomad-device-nvidia's "Power usage", else any
// attribute named like a power reading.
func powerIn(o *nomadapi.StatObject) (float64, bool) {
	if o == nil {
		return 0, false
	}
	for _, name := range []string{"Power draw", "Power usage"} {
		if w, ok := watts(o.Attributes[name]); ok {
			return w, true
		}
	}
	for name, v := range o.Attributes {
		n := strings.ToLower(name)
		if !strings.Contains(n, "power") || strings.Contains(n, "limit") || strings.Contains(n, "energy") {
			continue
		}
		if w, ok := watts(v); ok {
			return w, true
		}
	}
	for _, nested := range o.Nested {
		if w, ok := powerIn(nested); ok {
			return w, ok
		}
	}
	return 0, false
}

// watts reads a stat value in W or mW (the numerator of a fraction such as
// draw / limit).
func watts(v *nomadapi.StatValue) (float64, bool) {
	if v == nil {
		return 0, false
	}
	var x float64
	switch {
	case v.FloatNumeratorVal != nil:
		x = *v.FloatNumeratorVal
	case v.IntNumeratorVal != nil:
		x = float64(*v.IntNumeratorVal)
	default:
		return 0, false
	}
	switch v.Unit {
	case "W":
		return x, true
	case "mW":
		return x / 1000, true
	}
	return 0, false
}
