"""Notifications: events a bag or the fleet raises, recorded in the store and POSTed,
signed, to the webhooks that asked for them (docs/notifications.md).

- kinds.py: the kinds of event (imported by the bag spec; nothing else);
- emit.py: `Notices`, what the scheduler calls to raise an event (recorded in the
  pass's write batch, with one delivery per webhook), and the preemption-storm detector;
- delivery.py: `Deliverer`, the daemon's asyncio task that POSTs due deliveries with
  an HMAC signature, retries with exponential back-off and records every attempt.
"""
