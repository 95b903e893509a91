"""The pipeline's own records on a job's topics: mixture changes and unit costs on the control topic
(``control``), the spec in force (``spec_record``), the constructor's state records (``state_topic``), a
source's work plan (``work_plan``); and the one transactional shape every role shares (``role_protocol``).
The Kafka client plumbing under them, which the trainer side uses as well, is ``topics.kafka``."""
