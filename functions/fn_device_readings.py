"""fn_device_readings: a window-only function; the window in fn_device_readings.json does the work.

Each device's readings are judged against the time they reached the bucket (docs/time-semantics.md): a reading
whose event time is more than 5 minutes after its arrival is dead-lettered as `early`; one more than 5 minutes
before its arrival is windowed at arrival - 5 minutes; one behind its device's watermark is windowed at that
watermark. Count and average temperature per device per 5 minutes (`eventing windows fn_device_readings`).
"""
