"""fn_country_sessions: a window-only function; the session window in fn_country_sessions.json does the work.

Per country, customer updates at most 20 s apart in event time (`ts`) form one session; a session closes
once the watermark passes its last update + 20 s, and its count and sum of amount are stored once
(`eventing windows fn_country_sessions`). No session spans more than the 1 h max_duration.
"""
