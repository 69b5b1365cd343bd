"""fn_sales_per_minute: a window-only function; the window declared in fn_sales_per_minute.json does the work.

Every update of a customer becomes one row (its `ts`, `country` and `amount`), windowed by event time in
1-minute tumbling windows per country; each closed window's count and sum of amount is computed by
PySpark and stored once (`eventing windows fn_sales_per_minute`). A document without a usable `ts` goes
to the dead-letter queue as `bad_event_time`, a row for an already closed window as `late`.

A windowed function may also handle mutations like any other (define on_update / on_delete here); this one
defines neither, so the worker only extracts rows and calls no handler.
"""
