package cloud

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ControlPrefix is where every front end mounts ControlHandler.
const ControlPrefix = "/_control/"

// faultsWire is Faults with durations as Go duration strings ("50ms").
type faultsWire struct {
	Latency           string  `json:"latency"`
	ThrottleEvery     int     `json:"throttleEvery"`
	ThrottleRate      float64 `json:"throttleRate"`
	ThrottleBurst     int     `json:"throttleBurst"`
	ThrottleWriteOnly bool    `json:"throttleWriteOnly"`
	RetryAfter        string  `json:"retryAfter"`
	ServerErrorRate   float64 `json:"serverErrorRate"`
	InvisibleFor      string  `json:"invisibleFor"`
	QuotaLimit        int     `json:"quotaLimit"`
	CapacityFailures  int     `json:"capacityFailures"`
	BootDelay         string  `json:"bootDelay"`
	DenyAuth          bool    `json:"denyAuth"`
}

func toWire(f Faults) faultsWire {
	return faultsWire{
		Latency: f.Latency.String(), ThrottleEvery: f.ThrottleEvery, ThrottleRate: f.ThrottleRate,
		ThrottleBurst: f.ThrottleBurst, ThrottleWriteOnly: f.ThrottleWriteOnly, RetryAfter: f.RetryAfter.String(),
		ServerErrorRate: f.ServerErrorRate, InvisibleFor: f.InvisibleFor.String(), QuotaLimit: f.QuotaLimit,
		CapacityFailures: f.CapacityFailures, BootDelay: f.BootDelay.String(), DenyAuth: f.DenyAuth,
	}
}

func fromWire(w faultsWire) (Faults, error) {
	f := Faults{
		ThrottleEvery: w.ThrottleEvery, ThrottleRate: w.ThrottleRate, ThrottleBurst: w.ThrottleBurst,
		ThrottleWriteOnly: w.ThrottleWriteOnly, ServerErrorRate: w.ServerErrorRate, QuotaLimit: w.QuotaLimit,
		CapacityFailures: w.CapacityFailures, DenyAuth: w.DenyAuth,
	}
	for _, d := range []struct {
		name string
		in   string
		out  *time.Duration
	}{
		{"latency", w.Latency, &f.Latency}, {"retryAfter", w.RetryAfter, &f.RetryAfter},
		{"invisibleFor", w.InvisibleFor, &f.InvisibleFor}, {"bootDelay", w.BootDelay, &f.BootDelay},
	} {
		if d.in == "" {
			continue
		}
		v, err := time.ParseDuration(d.in)
		if err != nil || v < 0 {
			return Faults{}, fmt.Errorf("%s: %q is not a duration like 50ms or 2s", d.name, d.in)
		}
		*d.out = v
	}
	if f.ServerErrorRate < 0 || f.ServerErrorRate > 1 {
		return Faults{}, fmt.Errorf("serverErrorRate: %v is not between 0 and 1", f.ServerErrorRate)
	}
	return f, nil
}

// ControlHandler serves the test controls under ControlPrefix:
//
//	GET  faults            current knobs (durations as "50ms")
//	PUT  faults            set the knobs named in the body; others keep their value
//	POST kill?id=ID        terminate an instance behind the daemon's back
//	POST stop?id=ID        stop an instance behind the daemon's back
//	POST deallocate?id=ID  stop it and release its compute (Azure: PowerState/deallocated)
//	POST fail?id=ID        put it in the Failed state; it stays listed until deleted
//	POST tee?id=ID&tee=T   change what the cloud reports of its TEE ("" or absent: an ordinary VM)
//	POST instances         make an instance behind the daemon's back: JSON {name, tags,
//	                       instanceType, image, tee}, checked by nothing but the core
//	GET  counters          calls by operation, throttled, serverErrors, created, deleted
//	POST counters/reset    zero the counters
//	GET  instances         every instance, terminated and invisible ones too
//	GET  resources         every side resource (NICs, disks, volumes)
func ControlHandler(c *Cloud) http.Handler {
	mux := http.NewServeMux()
	p := ControlPrefix
	mux.HandleFunc("GET "+p+"faults", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, toWire(c.Faults()))
	})
	mux.HandleFunc("PUT "+p+"faults", func(w http.ResponseWriter, r *http.Request) {
		fw := toWire(c.Faults()) // fields the body leaves out keep their value
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&fw); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "faults: " + err.Error()})
			return
		}
		f, err := fromWire(fw)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		c.SetFaults(f)
		writeJSON(w, http.StatusOK, toWire(f))
	})
	instanceOp := func(op func(string) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			id := r.URL.Query().Get("id")
			if err := op(id); err != nil {
				status := http.StatusInternalServerError
				if errors.Is(err, ErrNotFound) {
					status = http.StatusNotFound
				}
				writeJSON(w, status, map[string]string{"error": err.Error()})
				return
			}
			writeJSON(w, http.StatusOK, map[string]string{"id": id})
		}
	}
	mux.HandleFunc("POST "+p+"kill", instanceOp(c.Kill))
	mux.HandleFunc("POST "+p+"stop", instanceOp(c.Stop))
	mux.HandleFunc("POST "+p+"deallocate", instanceOp(c.Deallocate))
	mux.HandleFunc("POST "+p+"fail", instanceOp(c.Fail))
	mux.HandleFunc("POST "+p+"tee", func(w http.ResponseWriter, r *http.Request) {
		tee := r.URL.Query().Get("tee")
		instanceOp(func(id string) error { return c.SetTEE(id, tee) })(w, r)
	})
	mux.HandleFunc("POST "+p+"instances", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Name         string            `json:"name"`
			Tags         map[string]string `json:"tags"`
			InstanceType string            `json:"instanceType"`
			Image        string            `json:"image"`
			TEE          string            `json:"tee"`
		}
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "instances: " + err.Error()})
			return
		}
		in, err := c.Create(CreateRequest{Name: body.Name, Tags: body.Tags, InstanceType: body.InstanceType, Image: body.Image, TEE: body.TEE})
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, in)
	})
	mux.HandleFunc("GET "+p+"counters", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, c.Counters())
	})
	mux.HandleFunc("POST "+p+"counters/reset", func(w http.ResponseWriter, _ *http.Request) {
		c.ResetCounters()
		writeJSON(w, http.StatusOK, map[string]string{})
	})
	mux.HandleFunc("GET "+p+"instances", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, c.Instances())
	})
	mux.HandleFunc("GET "+p+"resources", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, c.Resources(""))
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
