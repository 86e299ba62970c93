//go:build !caa_ledger_v2test

package ledger

// buildMigrations are migrations only some builds carry; the ordinary
// build has none.
func buildMigrations() []migration { return nil }

// buildRecordFields appends fields only some builds write; none here.
func buildRecordFields(b []byte, _ Record) []byte { return b }
