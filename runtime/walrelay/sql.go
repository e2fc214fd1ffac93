package walrelay

// The package's SQL, in one place. Names (slot, publication) are validated
// by sqlident before use and passed as parameters, or quoted with
// pgx.Identifier where a statement takes no parameters.

const (
	// walLevel reads the server's wal_level.
	walLevel = `SELECT current_setting('wal_level')`

	// publicationExists and createPublication: the relay's publication
	// lists no table (it exists because pgoutput takes one): the records
	// come as logical decoding messages, not row changes.
	publicationExists = `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`
	createPublication = `CREATE PUBLICATION %s`
	dropPublication   = `DROP PUBLICATION IF EXISTS %s`

	// slotRow reads the slot of this database.
	slotRow = `SELECT plugin, active, coalesce(active_pid, 0), coalesce(confirmed_flush_lsn::text, ''),
       coalesce(wal_status, ''), coalesce(safe_wal_size, -1),
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`

	// createSlot makes the logical slot; its consistent point is where the
	// relay's stream begins.
	createSlot = `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`
	dropSlot   = `SELECT pg_drop_replication_slot($1)`

	// heartbeat moves an idle database's stream forward: a
	// non-transactional message the relay reads past and confirms.
	heartbeat = `SELECT pg_logical_emit_message(false, $1, '')`

	// lockSetup serialises concurrent Setup calls.
	lockSetup = `SELECT pg_advisory_xact_lock(hashtext('protoevents.walrelay.setup'))`
)
