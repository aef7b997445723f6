"""The gang training run, Airflow-free: the Kueue Job it submits, how it is followed, how its failures
are classified, how long a silent run may stay silent, and the bookkeeping of attempts and resumes."""
