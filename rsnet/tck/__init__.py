"""rsnet.tck: the Reactive Streams TCK (technology compatibility kit), ported to Python and trio.

Subclass one of the verification classes in a pytest module and implement its factories; every
test of the official TCK 1.0.4 then runs against your implementation:

- :class:`PublisherVerification` (38 tests): ``create_publisher(elements)``,
  ``create_failed_publisher()``.
- :class:`SubscriberWhiteboxVerification` (27 tests): ``create_subscriber(probe)``,
  ``create_element(i)``; the subscriber reports what it receives to the probe.
- :class:`SubscriberBlackboxVerification` (26 tests): ``create_subscriber()``,
  ``create_element(i)``.
- :class:`IdentityProcessorVerification` (68 tests): ``create_identity_processor(buffer_size)``,
  ``create_failed_publisher()``, ``create_element(i)``.

Settings, the clock, the per-test nursery and the ``environment()`` hook are described in
:mod:`rsnet.tck.environment`; a per-class summary of the results in :mod:`rsnet.tck.report`.
"""

from rsnet.tck.environment import TestEnvironment
from rsnet.tck.processor import IdentityProcessorVerification
from rsnet.tck.publisher import PublisherVerification
from rsnet.tck.subscriber_blackbox import SubscriberBlackboxVerification
from rsnet.tck.subscriber_whitebox import SubscriberWhiteboxVerification

__all__ = [
    "IdentityProcessorVerification",
    "PublisherVerification",
    "SubscriberBlackboxVerification",
    "SubscriberWhiteboxVerification",
    "TestEnvironment",
]
