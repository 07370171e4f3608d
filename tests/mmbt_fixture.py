"""An origin-shaped FAKE of the MMBT checkout (tests only), laid out from the published
repository's facts (Light-Heart-Labs/MMBT-Messy-Model-Bench-Tests at ec660c18ea87,
tooling/scripts/run_microbench.sh and grade_microbench.sh), NOT from our presets: the
presets are tested against it. The harness and graders are our fakes (tests/fake_mmbt);
the file names, the table and the command lines are the real ones. As published, the
p1 grader's helper code_task_grader.py and the logalyzer starter are absent."""

from __future__ import annotations

import shutil
from pathlib import Path

FAKES = Path(__file__).parent / "fake_mmbt"

# task -> (prompt file in tooling/tasks/, input dir or "", grader, ground truth or "")
TABLE = {
    "p1_bugfix": ("task_code_adoption.md", "", "phase1_grade.py", ""),
    "p1_testwrite": ("task_test_writing.md", "", "phase1_grade.py", ""),
    "p1_refactor": ("task_refactoring.md", "", "phase1_grade.py", ""),
    "p2_extract": ("task_extraction.md", "tooling/inputs/phase2_extraction",
                   "phase2_extraction_grade.py",
                   "tooling/graders/ground_truth/phase2_extraction.json"),
    "p2_ci": ("task_ci_failure.md", "tooling/inputs/phase2_ci_failure",
              "phase2_ci_failure_grade.py", ""),
    "p2_hallucination": ("task_hallucination.md", "tooling/inputs/phase2_hallucination",
                         "phase2_hallucination_grade.py",
                         "tooling/graders/ground_truth/phase2_hallucination.json"),
    "p2_triage": ("task_triage.md", "tooling/inputs/phase2_triage", "phase2_triage_grade.py",
                  "tooling/graders/ground_truth/phase2_triage.json"),
    "p3_doc": ("task_doc_synthesis.md", "tooling/inputs/phase3_doc_synthesis",
               "phase3_doc_synthesis_grade.py",
               "tooling/graders/ground_truth/phase3_doc_synthesis.json"),
    "p3_business": ("task_business_memo.md", "tooling/inputs/phase3_business_memo",
                    "phase3_business_memo_grade.py",
                    "tooling/graders/ground_truth/phase3_business_memo.json"),
    "p3_market": ("task_market_research.md", "", "phase3_market_research_grade.py",
                  "tooling/graders/ground_truth/phase3_market_research_rubric.json"),
    "p3_writing": ("task_writing_editing.md", "tooling/inputs/phase3_writing_editing",
                   "phase3_writing_editing_grade.py",
                   "tooling/inputs/phase3_writing_editing/audience_briefs.json"),
    "p3_pm": ("task_project_mgmt.md", "tooling/inputs/phase3_project_mgmt",
              "phase3_project_mgmt_grade.py",
              "tooling/graders/ground_truth/phase3_project_mgmt.json"),
}
NO_DELIVERABLE = "p3_market"  # our fake agent ships nothing for it: MISSING_OUTPUT


def make_checkout(root: Path) -> Path:
    bench = root / "MMBT-Messy-Model-Bench-Tests"
    tooling = bench / "tooling"
    (tooling / "tasks").mkdir(parents=True)
    (tooling / "graders" / "ground_truth").mkdir(parents=True)
    shutil.copy(FAKES / "harness.py", tooling / "harness.py")
    for task, (prompt, inputs, grader, truth) in TABLE.items():
        text = f"# {task}\nDo the task.\n"
        if task == NO_DELIVERABLE:
            text += "NO_DELIVERABLE\n"
        (tooling / "tasks" / prompt).write_text(text)
        if inputs:
            (bench / inputs).mkdir(parents=True, exist_ok=True)
            (bench / inputs / "README.md").write_text(f"input of {task}\n")
        if truth:
            (bench / truth).parent.mkdir(parents=True, exist_ok=True)
            (bench / truth).write_text("{}\n")
        src = FAKES / ("phase1_grade.py" if grader == "phase1_grade.py" else "grade.py")
        shutil.copy(src, tooling / "graders" / grader)
    return bench


def add_p1_helper(bench: Path) -> None:
    """What the published checkout lacks: the p1 grader's helper and its baseline."""
    (bench / "tooling" / "graders" / "code_task_grader.py").write_text("# helper\n")
    (bench / "tooling" / "inputs" / "logalyzer").mkdir(parents=True, exist_ok=True)
