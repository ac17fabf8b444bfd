"""Models bundled with the trainer, each one implementation of the model contract
(`airflow_ett.trainer.contract`): nothing in the trainer knows them by name."""
