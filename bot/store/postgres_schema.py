"""The PostgreSQL schema as versioned migrations (`schema_version` has a row per one applied).

PostgreSQL starts at its own v1 in the shape of SQLite's v4: there is no history to
replay. Where SQLite orders by its implicit rowid, the table here has `seq BIGSERIAL`
(creation order, also the tie-break after a time column). Times are epoch seconds in
DOUBLE PRECISION; tool calls and media stay JSON in TEXT, as in SQLite; only `messages`
references `conversations`, as in SQLite.

Each script runs whole (psycopg sends a script without parameters as one query), and
every pending one runs in the same transaction, which holds the advisory lock `LOCK_KEY`.
"""

from __future__ import annotations

LOCK_KEY = 0x74616E64656D
"""The advisory lock that migrations hold ("tandem" in ASCII), so workers migrate once."""

VERSION_TABLE = ("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY,"
                 " applied_at DOUBLE PRECISION NOT NULL)")

TABLES = ("schema_version", "conversations", "messages", "turns", "tool_calls", "approvals",
          "rules", "inbound", "jobs", "processes", "summaries", "audit", "spend", "talk",
          "chat_models")

MIGRATIONS: list[str] = [
    """
    CREATE TABLE conversations (
        id BIGSERIAL PRIMARY KEY, platform TEXT NOT NULL, chat_id TEXT NOT NULL,
        thread_id TEXT NOT NULL DEFAULT '', session INTEGER NOT NULL DEFAULT 1,
        prompt_tokens BIGINT NOT NULL DEFAULT 0, completion_tokens BIGINT NOT NULL DEFAULT 0,
        cost DOUBLE PRECISION NOT NULL DEFAULT 0, created_at DOUBLE PRECISION NOT NULL,
        UNIQUE (platform, chat_id, thread_id));
    CREATE TABLE messages (
        id BIGSERIAL PRIMARY KEY, conv_id BIGINT NOT NULL REFERENCES conversations(id),
        session INTEGER NOT NULL, turn INTEGER NOT NULL, role TEXT NOT NULL,
        content TEXT NOT NULL, tool_calls TEXT, tool_call_id TEXT, name TEXT, media TEXT,
        created_at DOUBLE PRECISION NOT NULL);
    CREATE INDEX messages_by_conv ON messages (conv_id, session, id);
    CREATE TABLE turns (
        conv_id BIGINT NOT NULL, session INTEGER NOT NULL, turn INTEGER NOT NULL,
        status TEXT NOT NULL, steps INTEGER NOT NULL DEFAULT 0, requester TEXT NOT NULL,
        unattended BOOLEAN NOT NULL DEFAULT FALSE, reason TEXT,
        started_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (conv_id, session, turn));
    CREATE INDEX turns_open ON turns (status) WHERE status <> 'done';
    CREATE TABLE tool_calls (
        conv_id BIGINT NOT NULL, session INTEGER NOT NULL, call_id TEXT NOT NULL,
        turn INTEGER NOT NULL, name TEXT NOT NULL, arguments TEXT NOT NULL,
        state TEXT NOT NULL, outcome TEXT, updated_at DOUBLE PRECISION NOT NULL,
        seq BIGSERIAL NOT NULL, PRIMARY KEY (conv_id, session, call_id));
    CREATE INDEX tool_calls_by_turn ON tool_calls (conv_id, session, turn, seq);
    CREATE INDEX tool_calls_by_session ON tool_calls (conv_id, session, seq);
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY, conv_id BIGINT NOT NULL, session INTEGER NOT NULL,
        call_id TEXT NOT NULL, tool TEXT NOT NULL, summary TEXT NOT NULL,
        requester TEXT NOT NULL, status TEXT NOT NULL, decided_by TEXT,
        created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL,
        seq BIGSERIAL NOT NULL);
    CREATE INDEX approvals_pending ON approvals (status, conv_id);
    CREATE INDEX approvals_by_call ON approvals (conv_id, session, call_id);
    CREATE TABLE rules (
        id TEXT PRIMARY KEY, conv_id BIGINT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, seq BIGSERIAL NOT NULL,
        UNIQUE (conv_id, tool, key));
    CREATE TABLE inbound (
        ref TEXT PRIMARY KEY, conv TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
        done BOOLEAN NOT NULL DEFAULT FALSE, received_at DOUBLE PRECISION NOT NULL,
        seq BIGSERIAL NOT NULL);
    CREATE INDEX inbound_open ON inbound (received_at, seq) WHERE NOT done;
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY, conv_id BIGINT NOT NULL, spec TEXT NOT NULL, kind TEXT NOT NULL,
        anchor DOUBLE PRECISION NOT NULL, prompt TEXT NOT NULL, created_by TEXT NOT NULL,
        last_slot DOUBLE PRECISION, active BOOLEAN NOT NULL DEFAULT TRUE,
        created_at DOUBLE PRECISION NOT NULL, seq BIGSERIAL NOT NULL);
    CREATE TABLE processes (pid BIGINT PRIMARY KEY, started_at DOUBLE PRECISION NOT NULL);
    CREATE TABLE summaries (
        conv_id BIGINT NOT NULL, session INTEGER NOT NULL, through_id BIGINT NOT NULL,
        text TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (conv_id, session));
    """,
    # v2: where each approval's card was posted (any worker may edit it)
    """
    ALTER TABLE approvals ADD COLUMN card TEXT;
    """,
    # v3: a tool process belongs to the worker that started it (pids of two hosts may be
    # equal)
    """
    ALTER TABLE processes ADD COLUMN owner TEXT NOT NULL DEFAULT '';
    ALTER TABLE processes DROP CONSTRAINT processes_pkey;
    ALTER TABLE processes ADD PRIMARY KEY (owner, pid);
    """,
    # v4: a turn's final text until it is known to be shown (a worker that died in
    # between leaves it for the next load to show, in the turn's live message if it had
    # one), and inbound found by conversation
    # (a Slack thread Tandem was addressed in, whichever worker heard it)
    """
    ALTER TABLE turns ADD COLUMN unshown TEXT;
    ALTER TABLE turns ADD COLUMN live TEXT;
    CREATE INDEX turns_unshown ON turns (conv_id) WHERE unshown IS NOT NULL;
    CREATE INDEX inbound_by_conv ON inbound (conv);
    """,
    # v5: the audit log (append-only: the trigger refuses any update, and the deletion of
    # an entry less than a day old, whoever asks) and each day's spending per person and
    # per conversation (budgets)
    """
    CREATE TABLE audit (
        id BIGSERIAL PRIMARY KEY, at DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL,
        conv TEXT NOT NULL DEFAULT '', actor TEXT NOT NULL DEFAULT '',
        tool TEXT NOT NULL DEFAULT '', detail TEXT NOT NULL);
    CREATE INDEX audit_by_conv ON audit (conv, id);
    CREATE INDEX audit_by_time ON audit (at);
    CREATE FUNCTION tandem_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' THEN
            RAISE EXCEPTION 'the audit log is append-only';
        END IF;
        IF OLD.at > extract(epoch FROM now()) - 86400 THEN
            RAISE EXCEPTION 'the audit log is append-only (pruned after a day at least)';
        END IF;
        RETURN OLD;
    END $$;
    CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit
        FOR EACH ROW EXECUTE FUNCTION tandem_audit_append_only();
    CREATE TABLE spend (
        day TEXT NOT NULL, scope TEXT NOT NULL, tokens BIGINT NOT NULL DEFAULT 0,
        cost DOUBLE PRECISION NOT NULL DEFAULT 0, lifted BOOLEAN NOT NULL DEFAULT FALSE,
        PRIMARY KEY (day, scope));
    """,
    # the talk around conversations: messages Tandem saw (for edits of them), group talk
    # not addressed to it, and edits and deletions for the next turn
    """
    CREATE TABLE talk (
        seq BIGSERIAL PRIMARY KEY, place TEXT NOT NULL, message_id TEXT NOT NULL,
        kind TEXT NOT NULL, author_id TEXT NOT NULL, author TEXT NOT NULL,
        outside BOOLEAN NOT NULL DEFAULT FALSE, text TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL, before TEXT NOT NULL DEFAULT '',
        taken BOOLEAN NOT NULL DEFAULT FALSE);
    CREATE INDEX talk_by_place ON talk (place, kind, seq);
    CREATE INDEX talk_by_message ON talk (place, message_id);
    """,
    # the model a conversation chose with /model (none: the configured one)
    """
    CREATE TABLE chat_models (
        conv_id BIGINT PRIMARY KEY, model TEXT NOT NULL, chosen_by TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL);
    """,
    # standing rules with a scope: one conversation's session (NULL: every session), one
    # person (empty: everyone), who made it and until when (NULL: until revoked); no longer
    # unique (people may each hold the same rule)
    """
    ALTER TABLE rules DROP CONSTRAINT IF EXISTS rules_conv_id_tool_key_key;
    ALTER TABLE rules ADD COLUMN session INTEGER;
    ALTER TABLE rules ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE rules ADD COLUMN author TEXT NOT NULL DEFAULT '';
    ALTER TABLE rules ADD COLUMN author_name TEXT NOT NULL DEFAULT '';
    ALTER TABLE rules ADD COLUMN expires_at DOUBLE PRECISION;
    CREATE INDEX rules_by_call ON rules (conv_id, tool, key);
    """,
]
