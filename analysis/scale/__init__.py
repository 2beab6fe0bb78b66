"""The claims at scale, read from finished pbscale run folders: the one reader of run folders
(:mod:`.run_files`), the report's paths and atomic outputs (:mod:`.outputs`), the runs and
their readings (:mod:`.runs`), the gap test (:mod:`.gap_test`), the one front comparison every
verdict comes from (:mod:`.front_verdict`), its calibration against designs it did not choose
(:mod:`.calibration`) and the error control over a report (:mod:`.family`), the comparison of
Pareto fronts (:mod:`.fronts`), the transfer of settings across n (:mod:`.hyper`), the claims of
the pruning
and regression rows (:mod:`.claims`, :mod:`.regression`), each verdict under other readings
(:mod:`.robust`), ``--compare`` of the report and of ``analysis.pareto`` (:mod:`.compare`), the
report's tables (:mod:`.tables`), a study's run folders read and copied (:mod:`.study`), its
points and figures (:mod:`.plots`) and the report itself (:mod:`.study_report`); pruning runs as
``analysis.pareto``'s rows (:mod:`.pareto_rows`), its ``--overlay`` selection
(:mod:`.pareto_overlay`) and its figures (:mod:`.pareto_plots`).
The commands over them: ``python -m analysis.scale_report``, ``analysis.gap_calibration``,
``analysis.pareto``, ``analysis.regression`` (and ``analysis.report``'s scale rows)."""
