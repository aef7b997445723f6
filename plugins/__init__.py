"""The trainops Airflow UI plugin: fleet and run views, their JSON API under ``/trainops/api/`` and
two safe actions (release a quarantined node, return a run's capacity), all behind Airflow's login."""
