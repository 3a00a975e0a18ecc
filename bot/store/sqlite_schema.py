"""The SQLite schema as versioned migrations (`PRAGMA user_version` counts them).

Each script runs in one transaction, statement by statement (a trigger's body is one).
3: turns and tool calls are keyed by session (a provider's reused call ids and the
turn numbers of a new session no longer collide); approvals know their session;
summaries of trimmed turns.
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY, platform TEXT NOT NULL, chat_id TEXT NOT NULL,
        thread_id TEXT NOT NULL DEFAULT '', session INTEGER NOT NULL DEFAULT 1,
        prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
        cost REAL NOT NULL DEFAULT 0, created_at REAL NOT NULL,
        UNIQUE (platform, chat_id, thread_id));
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY, conv_id INTEGER NOT NULL REFERENCES conversations(id),
        session INTEGER NOT NULL, turn INTEGER NOT NULL, role TEXT NOT NULL,
        content TEXT NOT NULL, tool_calls TEXT, tool_call_id TEXT, name TEXT,
        created_at REAL NOT NULL);
    CREATE INDEX messages_by_conv ON messages (conv_id, session, id);
    CREATE TABLE turns (
        conv_id INTEGER NOT NULL, turn INTEGER NOT NULL, session INTEGER NOT NULL,
        status TEXT NOT NULL, steps INTEGER NOT NULL DEFAULT 0, requester TEXT NOT NULL,
        unattended INTEGER NOT NULL DEFAULT 0, reason TEXT, started_at REAL NOT NULL,
        PRIMARY KEY (conv_id, turn));
    CREATE TABLE tool_calls (
        conv_id INTEGER NOT NULL, call_id TEXT NOT NULL, turn INTEGER NOT NULL,
        name TEXT NOT NULL, arguments TEXT NOT NULL, state TEXT NOT NULL, outcome TEXT,
        updated_at REAL NOT NULL, PRIMARY KEY (conv_id, call_id));
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY, conv_id INTEGER NOT NULL, call_id TEXT NOT NULL,
        tool TEXT NOT NULL, summary TEXT NOT NULL, requester TEXT NOT NULL,
        status TEXT NOT NULL, decided_by TEXT, created_at REAL NOT NULL,
        expires_at REAL NOT NULL);
    CREATE INDEX approvals_pending ON approvals (status, conv_id);
    CREATE TABLE rules (
        id TEXT PRIMARY KEY, conv_id INTEGER NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
        created_at REAL NOT NULL, UNIQUE (conv_id, tool, key));
    CREATE TABLE inbound (
        ref TEXT PRIMARY KEY, conv TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
        done INTEGER NOT NULL DEFAULT 0, received_at REAL NOT NULL);
    CREATE INDEX inbound_open ON inbound (done) WHERE done = 0;
    """,
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY, conv_id INTEGER NOT NULL, spec TEXT NOT NULL, kind TEXT NOT NULL,
        anchor REAL NOT NULL, prompt TEXT NOT NULL, created_by TEXT NOT NULL, last_slot REAL,
        active INTEGER NOT NULL DEFAULT 1, created_at REAL NOT NULL);
    CREATE TABLE processes (pid INTEGER PRIMARY KEY, started_at REAL NOT NULL);
    """,
    # v3: turns and calls are addressed per session (a new session reuses turn numbers
    # and providers reuse call ids like `call_0`), and a summary per session. SQLite
    # cannot change a primary key, so `turns` and `tool_calls` are rebuilt. A v2 call's
    # session comes from its tool result message, else the assistant message that made
    # it, else its turn's row, else the conversation's current session. (v2's turns row
    # is the least sure: a later session's turn with the same number replaced it.)
    """
    CREATE INDEX v3_messages_by_turn ON messages (conv_id, turn, tool_call_id);
    CREATE TABLE turns_v3 (
        conv_id INTEGER NOT NULL, session INTEGER NOT NULL, turn INTEGER NOT NULL,
        status TEXT NOT NULL, steps INTEGER NOT NULL DEFAULT 0, requester TEXT NOT NULL,
        unattended INTEGER NOT NULL DEFAULT 0, reason TEXT, started_at REAL NOT NULL,
        PRIMARY KEY (conv_id, session, turn));
    INSERT INTO turns_v3 (conv_id, session, turn, status, steps, requester, unattended,
                          reason, started_at)
        SELECT conv_id, session, turn, status, steps, requester, unattended, reason,
               started_at FROM turns ORDER BY rowid;
    CREATE TABLE tool_calls_v3 (
        conv_id INTEGER NOT NULL, session INTEGER NOT NULL, call_id TEXT NOT NULL,
        turn INTEGER NOT NULL, name TEXT NOT NULL, arguments TEXT NOT NULL,
        state TEXT NOT NULL, outcome TEXT, updated_at REAL NOT NULL,
        PRIMARY KEY (conv_id, session, call_id));
    INSERT INTO tool_calls_v3 (conv_id, session, call_id, turn, name, arguments, state,
                               outcome, updated_at)
        SELECT c.conv_id, COALESCE(
            (SELECT m.session FROM messages m WHERE m.conv_id = c.conv_id
                AND m.turn = c.turn AND m.tool_call_id = c.call_id AND m.role = 'tool'
                ORDER BY m.id LIMIT 1),
            (SELECT m.session FROM messages m WHERE m.conv_id = c.conv_id
                AND m.turn = c.turn AND m.role = 'assistant'
                AND instr(m.tool_calls, '["' || c.call_id || '",') > 0
                ORDER BY m.id LIMIT 1),
            (SELECT t.session FROM turns t WHERE t.conv_id = c.conv_id AND t.turn = c.turn),
            (SELECT v.session FROM conversations v WHERE v.id = c.conv_id),
            1), c.call_id, c.turn, c.name, c.arguments, c.state, c.outcome, c.updated_at
        FROM tool_calls c ORDER BY c.rowid;
    DROP TABLE turns;
    ALTER TABLE turns_v3 RENAME TO turns;
    DROP TABLE tool_calls;
    ALTER TABLE tool_calls_v3 RENAME TO tool_calls;
    CREATE INDEX turns_open ON turns (status) WHERE status <> 'done';
    CREATE INDEX tool_calls_by_turn ON tool_calls (conv_id, session, turn);
    ALTER TABLE approvals ADD COLUMN session INTEGER NOT NULL DEFAULT 0;
    UPDATE approvals SET session = COALESCE(
        (SELECT c.session FROM tool_calls c WHERE c.conv_id = approvals.conv_id
            AND c.call_id = approvals.call_id ORDER BY c.rowid LIMIT 1),
        (SELECT m.session FROM messages m WHERE m.conv_id = approvals.conv_id
            AND m.tool_call_id = approvals.call_id AND m.role = 'tool'
            ORDER BY m.id LIMIT 1),
        (SELECT v.session FROM conversations v WHERE v.id = approvals.conv_id),
        0);
    CREATE INDEX approvals_by_call ON approvals (conv_id, session, call_id);
    DROP INDEX v3_messages_by_turn;
    CREATE TABLE summaries (
        conv_id INTEGER NOT NULL, session INTEGER NOT NULL, through_id INTEGER NOT NULL,
        text TEXT NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (conv_id, session));
    """,
    # v4: what came with a user's message (references as JSON, never the bytes)
    """
    ALTER TABLE messages ADD COLUMN media TEXT;
    """,
    # v5: where each approval's card was posted (any process may edit it)
    """
    ALTER TABLE approvals ADD COLUMN card TEXT;
    """,
    # v6: a tool process belongs to the worker that started it (the key is both: SQLite
    # cannot change a primary key, so the table is rebuilt)
    """
    CREATE TABLE processes_v6 (
        owner TEXT NOT NULL DEFAULT '', pid INTEGER NOT NULL, started_at REAL NOT NULL,
        PRIMARY KEY (owner, pid));
    INSERT INTO processes_v6 (owner, pid, started_at) SELECT '', pid, started_at
        FROM processes;
    DROP TABLE processes;
    ALTER TABLE processes_v6 RENAME TO processes;
    """,
    # v7: a turn's final text until it is known to be shown (a process that died in
    # between leaves it for the next load to show, in the turn's live message if it had
    # one), and inbound found by conversation
    # (a Slack thread Tandem was addressed in)
    """
    ALTER TABLE turns ADD COLUMN unshown TEXT;
    ALTER TABLE turns ADD COLUMN live TEXT;
    CREATE INDEX turns_unshown ON turns (conv_id) WHERE unshown IS NOT NULL;
    CREATE INDEX inbound_by_conv ON inbound (conv);
    """,
    # v8: the audit log (append-only: the triggers refuse any update, and the deletion of
    # an entry less than a day old, whoever asks) and each day's spending per person and
    # per conversation (budgets)
    """
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL,
        conv TEXT NOT NULL DEFAULT '', actor TEXT NOT NULL DEFAULT '',
        tool TEXT NOT NULL DEFAULT '', detail TEXT NOT NULL);
    CREATE INDEX audit_by_conv ON audit (conv, id);
    CREATE INDEX audit_by_time ON audit (at);
    CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    CREATE TRIGGER audit_no_early_delete BEFORE DELETE ON audit
        WHEN OLD.at > CAST(strftime('%s', 'now') AS REAL) - 86400
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only (pruned after a day at least)'); END;
    CREATE TABLE spend (
        day TEXT NOT NULL, scope TEXT NOT NULL, tokens INTEGER NOT NULL DEFAULT 0,
        cost REAL NOT NULL DEFAULT 0, lifted INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (day, scope));
    """,
    # the talk around conversations: messages Tandem saw (for edits of them), group talk
    # not addressed to it, and edits and deletions for the next turn
    """
    CREATE TABLE talk (
        seq INTEGER PRIMARY KEY, place TEXT NOT NULL, message_id TEXT NOT NULL,
        kind TEXT NOT NULL, author_id TEXT NOT NULL, author TEXT NOT NULL,
        outside INTEGER NOT NULL DEFAULT 0, text TEXT NOT NULL, at REAL NOT NULL,
        before TEXT NOT NULL DEFAULT '', taken INTEGER NOT NULL DEFAULT 0);
    CREATE INDEX talk_by_place ON talk (place, kind, seq);
    CREATE INDEX talk_by_message ON talk (place, message_id);
    """,
    # the model a conversation chose with /model (none: the configured one)
    """
    CREATE TABLE chat_models (
        conv_id INTEGER PRIMARY KEY, model TEXT NOT NULL, chosen_by TEXT NOT NULL,
        at REAL NOT NULL);
    """,
    # standing rules with a scope: one conversation's session (NULL: every session), one
    # person (empty: everyone), who made it and until when (NULL: until revoked); the
    # table is rebuilt without its uniqueness (people may each hold the same rule)
    """
    CREATE TABLE rules_scoped (
        id TEXT PRIMARY KEY, conv_id INTEGER NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
        created_at REAL NOT NULL, session INTEGER, user_id TEXT NOT NULL DEFAULT '',
        author TEXT NOT NULL DEFAULT '', author_name TEXT NOT NULL DEFAULT '',
        expires_at REAL);
    INSERT INTO rules_scoped (id, conv_id, tool, key, created_at)
        SELECT id, conv_id, tool, key, created_at FROM rules;
    DROP TABLE rules;
    ALTER TABLE rules_scoped RENAME TO rules;
    CREATE INDEX rules_by_call ON rules (conv_id, tool, key);
    """,
]
